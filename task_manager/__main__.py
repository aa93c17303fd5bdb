"""`python -m task_manager --port PORT --env-url URL [--conf FILE]`: the self-questioning service."""

from __future__ import annotations

import argparse
import sys

from loguru import logger

from common.config import ConfigError
from common.service import run_app, service_cli
from task_manager.settings import TaskManagerSettings


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-url", dest="env_url", default=None, help="the environment service's base URL")
    parser.add_argument("--store-dir", dest="store_dir", default=None, help="task store directory (resumable)")


def main(argv: list[str] | None = None) -> None:
    settings, _ = service_cli("task_manager", TaskManagerSettings, "task_manager",
                              "Self-questioning: explore environments, synthesize verified tasks, grade, curriculum",
                              _arguments, argv=argv)
    from task_manager.app import build_app

    try:
        app = build_app(settings)  # type: ignore[arg-type]
    except ConfigError as exc:
        sys.exit(f"task_manager: {exc}")
    logger.info("task_manager: env service {}, store {}, environments {}", settings.env_url,  # type: ignore[attr-defined]
                settings.store_dir, ", ".join(settings.environments))  # type: ignore[attr-defined]
    run_app(app, settings.host, settings.port, settings.log_level,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)


if __name__ == "__main__":
    main()
