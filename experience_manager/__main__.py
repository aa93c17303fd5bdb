"""`python -m experience_manager --port PORT [--store PATH | --qdrant-url URL] [--conf FILE]`."""

from __future__ import annotations

import argparse
import sys

from common.service import run_app, service_cli
from experience_manager.settings import ExperienceManagerSettings


def _arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--store", default=None, help="folder for Qdrant local mode, the journal and meta.json")
    where.add_argument("--qdrant-url", dest="qdrant_url", default=None,
                       help="a Qdrant server (the journal and meta.json stay in the store folder)")


def main(argv: list[str] | None = None) -> None:
    settings, _args = service_cli("experience_manager", ExperienceManagerSettings, "experience_manager",
                                  "Distill, store, retrieve and score agent experiences.", _arguments, argv)
    assert isinstance(settings, ExperienceManagerSettings)
    from experience_manager.api import build_app

    try:
        app = build_app(settings)
    except Exception as exc:  # configuration problems found while building, e.g. a missing API key
        sys.exit(f"experience_manager: {exc}")
    run_app(app, settings.host, settings.port, settings.log_level)


if __name__ == "__main__":
    main()
