"""`python -m experience_manager --port PORT [--store PATH | --qdrant-url URL] [--conf FILE]`."""

from __future__ import annotations

import os

# One BLAS thread: retrieval is a matrix-vector product, memory-bound; on a busy 2-core box a second
# BLAS thread fights the embedding thread and made a 10k search 12 ms instead of 1 ms (measured).
# Must be set before numpy is imported.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402

from common.service import run_app, service_cli  # noqa: E402
from experience_manager.settings import ExperienceManagerSettings  # noqa: E402


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
    run_app(app, settings.host, settings.port, settings.log_level,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)


if __name__ == "__main__":
    main()
