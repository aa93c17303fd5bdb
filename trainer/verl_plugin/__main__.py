"""CLI of the veRL backend.

    python -m trainer.verl_plugin overrides --conf RUN.yaml [--env-url URL] [key=value ...]
        one Hydra override per line for `python -m verl.trainer.main_ppo` (read them with `mapfile -t`)
    python -m trainer.verl_plugin dataset --env-url URL --env NAME --split train --out train.parquet
        the task parquet veRL's dataloader reads
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from common.config import ConfigError, compose


def _overrides(args: argparse.Namespace) -> int:
    from trainer.verl_plugin.overrides import translate

    run = compose(args.conf, args.yaml_overrides)
    for line in translate(run, env_url=args.env_url, experience_url=args.experience_url, judge_url=args.judge_url,
                          task_url=args.task_url):
        print(line)
    return 0


def _dataset(args: argparse.Namespace) -> int:
    from trainer.verl_plugin.dataset import env_tasks, write_parquet

    tasks = asyncio.run(env_tasks(args.env_url, args.env, args.split, args.limit))
    path = write_parquet(tasks, args.out)
    print(f"wrote {len(tasks)} tasks of {args.env}/{args.split} to {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.verl_plugin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    over = commands.add_parser("overrides", help="print veRL Hydra overrides for a run YAML")
    over.add_argument("--conf", required=True, help="the run YAML (with `trainer` and `verl` sections)")
    over.add_argument("--env-url", help="env_service URL (default: trainer.services.env_url)")
    over.add_argument("--experience-url", help="experience_manager URL (default: trainer.services.experience_url)")
    over.add_argument("--judge-url", help="judge service URL (default: trainer.services.judge_url)")
    over.add_argument("--task-url", help="task_manager URL (default: trainer.services.task_url)")
    over.add_argument("yaml_overrides", nargs="*", help="dotted key=value changes to the run YAML")
    data = commands.add_parser("dataset", help="write the task parquet veRL reads")
    data.add_argument("--env-url", required=True)
    data.add_argument("--env", required=True, help="environment name on the env service")
    data.add_argument("--split", default="train", choices=["train", "validation", "test"])
    data.add_argument("--limit", type=int, default=None, help="first N tasks only")
    data.add_argument("--out", required=True, help="parquet path")
    args = parser.parse_args(argv)
    try:
        return _overrides(args) if args.command == "overrides" else _dataset(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
