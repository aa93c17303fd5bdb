"""`python -m judge --port PORT [--conf FILE]`: the step-labelling judge service."""

from __future__ import annotations

import argparse
import sys

from common.config import ConfigError, validate
from common.llm import LLMError
from common.service import run_app, service_cli
from judge.settings import JudgeSettings


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--llm-base-url", default=None, help="judge LLM endpoint, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--llm-model", default=None, help="judge LLM model name")
    parser.add_argument("--audit-log", default=None, help="JSONL audit file of judged trajectories")


def main(argv: list[str] | None = None) -> None:
    settings, args = service_cli("judge", JudgeSettings, "judge",
                                 "LLM judge: one GOOD/BAD label per trajectory step.", _add_arguments, argv)
    assert isinstance(settings, JudgeSettings)
    if args.llm_base_url or args.llm_model:
        llm = settings.llm.model_dump() if settings.llm else {}
        llm.update({k: v for k, v in (("base_url", args.llm_base_url), ("model", args.llm_model)) if v})
        try:
            settings = validate(JudgeSettings, {**settings.model_dump(), "llm": llm}, root="judge")
        except ConfigError as exc:
            sys.exit(f"judge: {exc}")

    from judge.app import create_judge_app

    try:
        app = create_judge_app(settings)
    except (ValueError, LLMError) as exc:
        sys.exit(f"judge: {exc}")
    run_app(app, settings.host, settings.port, settings.log_level,
            tls_certfile=settings.tls_certfile, tls_keyfile=settings.tls_keyfile)


if __name__ == "__main__":
    main()
