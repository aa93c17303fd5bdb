"""`python -m env_service --port PORT [--conf FILE]`: serve every enabled environment."""

from __future__ import annotations

import sys

from loguru import logger

from common.config import ConfigError
from common.service import reserve_port, run_app, service_cli
from env_service.settings import EnvServiceSettings


def main(argv: list[str] | None = None) -> None:
    settings, _ = service_cli("env_service", EnvServiceSettings, "env_service",
                              "Gym-style environments over HTTP (/v1 and AgentEvolver-compatible routes)", argv=argv)
    from env_service.app import build_app

    listener = reserve_port(settings.host, settings.port)
    try:
        app = build_app(settings)  # type: ignore[arg-type]
    except ConfigError as exc:  # exit 2: the launcher does not restart a configuration error
        print(f"env_service: {exc}", file=sys.stderr)
        sys.exit(2)
    logger.info("env_service: {} backend, environments: {}", settings.backend, ", ".join(settings.environments))
    run_app(app, settings.host, settings.port, settings.log_level, sock=listener,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)


if __name__ == "__main__":
    main()
