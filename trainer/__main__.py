"""`python -m trainer --conf FILE [key=value ...]`: train against services that are already up.

Reads the `trainer` section of the run YAML (overrides as `trainer.steps=20`). With `ray.enabled`
the loop runs in a Ray actor (`TrainerActor`, on the dashboard at 127.0.0.1:8265 by default);
otherwise in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from loguru import logger

from common.config import ConfigError, load_config
from trainer.config import TrainerConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", required=True, help="the run's YAML; its `trainer` section is used")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. trainer.steps=5")
    args = parser.parse_args(argv)
    try:
        config = load_config(TrainerConfig, args.conf, args.overrides, section="trainer")
    except ConfigError as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return 2
    from common.http import PeerUnavailable
    from trainer.resilience import EmptyStepError

    try:
        if not config.ray.enabled:
            from trainer.local import LocalTrainer

            result = asyncio.run(LocalTrainer(config).run())
        else:
            result = run_on_ray(config)
    except (PeerUnavailable, EmptyStepError) as exc:
        # A restart cannot bring a peer back: exit 3 tells the launcher not to restart the trainer.
        print(f"trainer: {_cause(exc)}", file=sys.stderr)
        return 3
    from trainer.summary import print_summary

    print_summary(result)
    # The last line is machine-readable (the launcher reads it); the same is in <output_dir>/summary.json.
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, default=str))
    return 0


def _cause(exc: BaseException) -> str:
    """The original message (a Ray task error wraps it in the remote traceback)."""
    cause = getattr(exc, "cause", None)
    return str(cause) if cause is not None else str(exc)


def run_on_ray(config: TrainerConfig) -> dict:
    import ray

    from trainer.local import TrainerActorImpl

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address)
    else:
        # "local" always starts a fresh cluster: a bare ray.init() would join whatever cluster a
        # stale /tmp/ray session points at, with its own resources.
        ray.init(address="local", include_dashboard=config.ray.dashboard, dashboard_host="127.0.0.1",
                 dashboard_port=config.ray.dashboard_port, num_cpus=max(2, int(config.ray.num_cpus) + 1),
                 log_to_driver=True)
    try:
        actor_cls = ray.remote(num_cpus=config.ray.num_cpus)(TrainerActorImpl)
        actor = actor_cls.options(name="TrainerActor").remote(config.model_dump())
        logger.info("trainer running in Ray actor TrainerActor")
        return ray.get(actor.run.remote())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
