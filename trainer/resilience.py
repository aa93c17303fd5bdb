"""What the trainer rode through: each peer's outages, retried rollouts and steps, degradations.

The counters live in the clients (`common.http.OutageCounters`), the rollout stats and the peers;
this module gathers them for the run summary and carries them through checkpoints, so a restarted
trainer still reports the outages before its crash.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.http import OutageCounters, ServiceClient
from trainer.mechanisms import Mechanisms
from trainer.peers import EnvPeer, merged_counters
from trainer.policy import EndpointPolicy, Policy


class EmptyStepError(RuntimeError):
    """Every group of a step was dropped, again and again: training on nothing is not a step."""


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_LOG_TAIL_BYTES = 256 * 1024


def environment_traceback_hint(logs_dir: str | None) -> str:
    """Where an environment error's traceback is: the env service's log under the launcher's `logs_dir`, with
    the last frame that log holds (file, line, function), or '' when the trainer was not told where logs go."""
    if not logs_dir:
        return ""
    path = Path(logs_dir) / "env_service.log"
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
            tail = log.read().decode("utf-8", "replace")
    except OSError:  # the env service runs on another machine, or wrote no log
        return f"; its traceback is in the env service's log ({path})"
    frames = _FRAME.findall(tail)
    if not frames:
        return f"; its traceback is in {path}"
    file, line, function = frames[-1]
    return f"; its traceback is in {path}, last frame: {file}, line {line}, in {function}"


@dataclass
class StepCounters:
    empty_step_retries: int = 0  # steps collected again because all their groups were dropped
    resumes: int = 0  # times this run continued from a checkpoint (a restarted trainer)
    policy_reloads: int = 0  # the model server came back without the trained weights and got them again


def clients_by_peer(env: EnvPeer | None, mechanisms: Mechanisms | None,
                    policy: Policy | None) -> dict[str, list[ServiceClient]]:
    """Every HTTP client the trainer calls a peer with, by the peer's launcher name."""
    out: dict[str, list[ServiceClient]] = {}
    if env is not None:
        out["env_service"] = [env.client]
    if mechanisms is not None:
        if mechanisms.tasks is not None:
            out["task_manager"] = [mechanisms.tasks.client]
        if mechanisms.experience is not None:
            out["experience_manager"] = [mechanisms.experience.client, mechanisms.experience.delivery]
        if mechanisms.judge is not None:
            out["judge"] = [mechanisms.judge.client]
    if isinstance(policy, EndpointPolicy):
        out["llm_server"] = [policy.client]
    return out


def outage_table(clients: dict[str, list[ServiceClient]]) -> dict[str, dict[str, float]]:
    return {name: merged_counters(*group).as_dict() for name, group in clients.items()}


def load_outages(clients: dict[str, list[ServiceClient]], state: dict[str, dict[str, Any]]) -> None:
    """Counters from a checkpoint onto the fresh clients (the first client of a peer holds the total)."""
    for name, values in state.items():
        group = clients.get(name)
        if group:
            group[0].outage_counters = OutageCounters(**values)


def degradations(mechanisms: Mechanisms | None) -> list[str]:
    if mechanisms is None:
        return []
    return [line for peer in (mechanisms.experience, mechanisms.judge, mechanisms.tasks) if peer is not None
            for line in peer.degradations()]


def counters_dict(counters: StepCounters) -> dict[str, int]:
    return asdict(counters)
