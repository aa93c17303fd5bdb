"""One loguru set-up for every process: one line per event, service name and request id on each."""

from __future__ import annotations

import logging
import os
import sys

from loguru import logger

FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> | <level>{level: <7}</level> | "
    "<cyan>{extra[service]}</cyan> | {extra[request_id]} | {message}"
)


class _InterceptHandler(logging.Handler):
    """Route stdlib logging (uvicorn, ray, httpx) through loguru so every line has one format."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def setup_logging(service: str, level: str | None = None, log_file: str | None = None) -> None:
    level = (level or os.environ.get("EVOLVER_LOG_LEVEL", "INFO")).upper()
    logger.remove()
    logger.configure(extra={"service": service, "request_id": "-"})
    logger.add(sys.stderr, level=level, format=FORMAT, colorize=None, backtrace=False, diagnose=False)
    log_file = log_file or os.environ.get("EVOLVER_LOG_FILE")
    if log_file:
        logger.add(log_file, level=level, format=FORMAT, colorize=False, enqueue=True, diagnose=False)
    logging.basicConfig(handlers=[_InterceptHandler()], level=0, force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True
    # Access logs are per request and would drown the event log; our middleware logs errors.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
