"""`python -m studio --runs runs/ [--host 127.0.0.1] [--port 8090]`: browse run folders in a browser."""

from __future__ import annotations

from pathlib import Path

from loguru import logger

from common.service import run_app, service_cli
from studio.settings import StudioSettings


def main(argv: list[str] | None = None) -> None:
    def add_arguments(parser) -> None:
        parser.add_argument("--runs", default=None, help="folder of run folders (default runs/), or one run folder")
        parser.add_argument("--page-size", dest="page_size", type=int, default=None, help="rows per list page")
        parser.add_argument("--refresh-s", dest="refresh_s", type=float, default=None,
                            help="how often a live run page polls (seconds)")

    settings, _ = service_cli("studio", StudioSettings, "studio", "The web view of evolver runs",
                              add_arguments=add_arguments, argv=argv)
    from studio.app import build_app

    assert isinstance(settings, StudioSettings)
    if not Path(settings.runs).is_dir():
        logger.warning("studio: {} does not exist yet; runs appear once it does", settings.runs)
    app = build_app(settings)
    logger.info("studio: http://{}:{}/ over {}", settings.host, settings.port, Path(settings.runs).resolve())
    run_app(app, settings.host, settings.port, settings.log_level,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)


if __name__ == "__main__":
    main()
