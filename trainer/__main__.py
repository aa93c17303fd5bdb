"""`python -m trainer --conf FILE [key=value ...]`: train against services that are already up.

Reads the `trainer` section of the run YAML (overrides as `trainer.steps=20`). With `ray.enabled`
the loop runs in a Ray actor (`TrainerActor`, on the dashboard at 127.0.0.1:8265 by default);
otherwise in this process. With `trainer.agent` (a user's own agent, through the gateway) it runs in this
process, which imports the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from loguru import logger

from common.config import ConfigError, load_config
from trainer.config import TrainerConfig

DISK_FULL_EXIT = 5  # a write found the disk full (the trainer's own, or a service's 507): not restarted


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
    from engine.device import DeviceUnavailable, resolve_device

    if not config.ray.enabled:
        try:  # a missing GPU fails here, before the trainer's modules and its model load
            resolve_device(config.device, "trainer.device")
        except DeviceUnavailable as exc:
            print(f"trainer: {exc}", file=sys.stderr)
            return 2
    try:
        if config.agent is not None:  # the user's agent runs in this process, beside the loop that trains it
            from trainer.agent_trainer import AgentTrainer

            result = asyncio.run(AgentTrainer(config).run())
        elif not config.ray.enabled:
            from trainer.local import LocalTrainer

            result = asyncio.run(LocalTrainer(config).run())
        else:
            result = run_on_ray(config)
    except Exception as exc:
        code = _exit_code(exc, config)
        if code is None:
            raise
        return code
    from trainer.summary import print_summary

    print_summary(result)
    # The last line is machine-readable (the launcher reads it); the same is in <output_dir>/summary.json.
    print(json.dumps({k: v for k, v in result.items() if k != "history"}, default=str))
    return 0


def _exit_code(exc: Exception, config: TrainerConfig) -> int | None:
    """The exit code of a run that failed for a reason the launcher acts on (its message printed); None for any
    other failure. The exceptions' modules import torch: imported here, where a run has already ended."""
    from common.http import PeerUnavailable
    from engine.device import DeviceUnavailable
    from trainer.collapse import COLLAPSED_EXIT, RunCollapsed
    from trainer.resilience import EmptyStepError

    if isinstance(exc, DeviceUnavailable):
        print(f"trainer: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, (PeerUnavailable, EmptyStepError)):
        # A restart cannot bring a peer back: exit 3 tells the launcher not to restart the trainer.
        print(f"trainer: {_cause(exc)}", file=sys.stderr)
        return 3
    if isinstance(exc, RunCollapsed):
        # The policy degenerated: training on would only go further; summary.json names the signal.
        print(f"trainer: {_cause(exc)}; summary in {Path(config.output_dir) / 'summary.json'}", file=sys.stderr)
        return COLLAPSED_EXIT
    full = _disk_full(exc)
    if full is not None:
        # A restart would find the same full disk: stop, and say how to go on once there is space.
        print(f"trainer: {full}. The last complete checkpoint in {Path(config.output_dir) / 'checkpoints'} is "
              f"intact: once there is space, run again with trainer.resume=true (launcher.resume: true) to continue "
              f"from it", file=sys.stderr)
        return DISK_FULL_EXIT
    return None


def _disk_full(exc: BaseException) -> str | None:
    """What said the disk is full: one of the trainer's own writes, or a peer's 507; None if nothing did."""
    from common.faults import disk_full_message, is_disk_full
    from common.http import ServiceCallError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_disk_full(current):
            return disk_full_message(current)
        if isinstance(current, ServiceCallError) and current.status == 507:
            return f"{current.url} answered 507: {current.message}"
        current = getattr(current, "cause", None) or current.__cause__ or current.__context__
    return None


def _cause(exc: BaseException) -> str:
    """The original message (a Ray task error wraps it in the remote traceback)."""
    cause = getattr(exc, "cause", None)
    return str(cause) if cause is not None else str(exc)


ACTOR_NAME = "TrainerActor"


def _namespace(output_dir: str) -> str:
    digest = hashlib.sha256(str(Path(output_dir).resolve()).encode()).hexdigest()[:16]
    return f"evolver-trainer-{digest}"


def _stop_leftover_actor(ray: Any, name: str, timeout_s: float = 60.0) -> bool:
    """Kill a live actor `name` of this namespace and wait until its name is free; True if there was one."""
    try:
        leftover = ray.get_actor(name)
    except ValueError:
        return False
    logger.warning("a trainer actor of an earlier driver is still running on this output folder: stopping it")
    ray.kill(leftover, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return True
        time.sleep(0.2)
    raise RuntimeError(f"the earlier trainer actor {name!r} did not stop within {timeout_s:.0f} s")


def run_on_ray(config: TrainerConfig) -> dict:
    import ray

    from trainer.device import actor_options
    from trainer.ray_actor import TrainerActorImpl

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        # One namespace per output folder: a restarted trainer finds the actor its killed driver left
        # behind (Ray reaps it only asynchronously) and stops it before training into the same folder.
        ray.init(address=address, namespace=_namespace(config.output_dir))
        _stop_leftover_actor(ray, ACTOR_NAME)
    else:
        # "local" always starts a fresh cluster: a bare ray.init() would join whatever cluster a
        # stale /tmp/ray session points at, with its own resources.
        ray.init(address="local", include_dashboard=config.ray.dashboard, dashboard_host="127.0.0.1",
                 dashboard_port=config.ray.dashboard_port, num_cpus=max(2, int(config.ray.num_cpus) + 1),
                 log_to_driver=True)
    try:
        options = actor_options(config.ray.num_cpus, config.device, ray.cluster_resources().get("GPU", 0), ACTOR_NAME)
        actor = ray.remote(TrainerActorImpl).options(**options, **_placement(config)).remote(config.model_dump())
        logger.info("trainer running in Ray actor {} ({} CPU, {} GPU)", ACTOR_NAME, options["num_cpus"],
                    options["num_gpus"])
        running = actor.run.remote()
        # The summary's module imports torch: imported while the actor starts and trains, not after it.
        import trainer.summary  # noqa: F401
        return ray.get(running)
    finally:
        ray.shutdown()


def _placement(config: TrainerConfig) -> dict:
    """Where Ray puts the trainer actor (`trainer.ray` resources and node labels, all hard; its GPUs follow
    `trainer.device`, `trainer.device.actor_options`) and the run's token, which its calls to the services carry."""
    options: dict = {}
    token = os.environ.get("EVOLVER_API_TOKEN")
    if token:  # a worker process on a joined cluster does not inherit this process's environment
        options["runtime_env"] = {"env_vars": {"EVOLVER_API_TOKEN": token}}
    if config.ray.resources:
        options["resources"] = dict(config.ray.resources)
    if config.ray.node_labels:
        from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

        options["scheduling_strategy"] = NodeLabelSchedulingStrategy(
            hard={k: In(v) for k, v in config.ray.node_labels.items()})
    return options


if __name__ == "__main__":
    sys.exit(main())
