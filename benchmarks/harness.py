"""What the benchmark scripts share: the repository root, the machine's load, best-of timing, the JSON line out,
the flights probes' common flags, and a
whole-stack launcher run at the smallest settings.

A script run as a file (`python benchmarks/<area>/<name>.py`) puts the repository root on `sys.path` first,
`sys.path.insert(0, str(Path(__file__).resolve().parents[2]))`, and then imports from here; run as a module
(`python -m benchmarks.<area>.<name>`) it needs nothing. Free ports and services come from `tests.helpers`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load_1m() -> float:
    """The 1-minute load average: the machine may be shared, so a timing is only as quiet as this."""
    return round(os.getloadavg()[0], 2)


def load_avg() -> list[float]:
    """The 1-, 5- and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` calls of `run`: noise from other processes only ever adds time."""
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


def emit(result: dict[str, Any], out: Path | str | None = None) -> str:
    """Print `result` as one JSON line and, given `out`, write the same line there (its folder made)."""
    line = json.dumps(result)
    print(line)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")
    return line


def add_probe_arguments(parser: argparse.ArgumentParser, *, max_batch: int = 8) -> None:
    """The rollout and evaluation flags the flights probes share, with one set of defaults so that their
    numbers compare (40 evaluation tasks, 4 turns, 64 new tokens, a 1536-token context)."""
    parser.add_argument("--eval-tasks", type=int, default=40)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=1536)
    parser.add_argument("--max-batch", type=int, default=max_batch, help="rows the engine decodes at once")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)


def full_stack_config(*, experiment: str, runs: Path | str, model: str) -> dict[str, Any]:
    """The launcher config, as a dict to adjust and dump, of a run like the quickstart's at the smallest settings:
    flights with synthesis, all five services, ADCA-GRPO with the judge, experience for half of each group, the
    policy served by llm_server, a checkpoint every step. The launcher and service benchmarks that kill and
    restart its children (chaos, soak) run it."""
    services = ["llm_server", "env_service", "task_manager", "experience_manager", "judge"]
    return {
        "launcher": {"experiment": experiment, "runs_dir": str(runs), "services": services,
                     "ports": dict.fromkeys(services, "auto"),
                     "threads": {"default": 1, "llm_server": 1, "trainer": 1},
                     # The kills are under test, not self-questioning: 4 random explorations often change no state,
                     # and the run then trains on the environment's own tasks rather than stopping.
                     "synthesis": {"episodes": 4, "allow_no_tasks": True}},
        "llm_server": {"model": model, "max_batch": 8},
        "env_service": {"environments": {"flights": {}}},
        "task_manager": {"environments": ["flights"], "dedup": {"embeddings": False},
                         "explore": {"explorer": "random", "breadth_steps": 4, "depth_steps": 4},
                         "synthesis": {"synthesizer": "hindsight", "max_goals": 2},
                         "mixture": {"synthetic_ratio": 0.5, "use_original": True}},
        "experience_manager": {"summary": {"mode": "heuristic"}},
        "judge": {"llm": {"base_url": "llm_server"}, "retries": 0, "max_analysis_chars": 0},
        "trainer": {"model": model, "tasks_per_step": 2, "progress": False, "tensorboard": False, "plot": False,
                    "policy": {"kind": "endpoint", "url": "llm_server"},
                    "rollout": {"env": "flights", "n": 4, "max_turns": 2, "max_new_tokens": 8, "max_context": 1536,
                                "experience_ratio": 0.5},
                    "advantage": {"estimator": "adca_grpo"},
                    "checkpoint": {"every": 1, "keep": 2},
                    "eval": {"before": False, "after": False, "tasks": 2}},
    }


def start_launcher(conf: Path, log: Path) -> subprocess.Popen:
    """`python launcher.py --conf conf` in its own process group (so that one signal stops all it started), its
    output in `log`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def write_result(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    """`result` and the load averages now, as `<args.out>/<args.name>.json` (indented, the folder made). A run of
    phases calls it after each, so that one cut short keeps what it measured."""
    path = Path(args.out) / f"{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "load_avg_now": load_avg()}, indent=1) + "\n")
    return path


def run_and_write(parser: argparse.ArgumentParser,
                  run: Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Parse `parser`'s flags (`--name` and `--out` among them), run `run(args)` to the end, write its result
    (`write_result`) and print it as one JSON line."""
    args = parser.parse_args()
    result = asyncio.run(run(args))
    write_result(args, result)
    print(json.dumps(result))
    return result


async def greedy_rollouts(model: Any, tokenizer: Any, env: Any, tasks: list[Any], config: Any,
                          args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """One greedy episode per task of the in-process `model` on the CPU (`args.max_batch` rows at once,
    `args.threads` threads, seeded by `args.seed`): the evaluation summary and the rollouts, by task id."""
    import torch

    from trainer.local import rollout_dtype
    from trainer.policy import InProcessPolicy
    from trainer.rollout import evaluate_policy

    policy = InProcessPolicy(model, tokenizer, max_batch=args.max_batch, threads=args.threads,
                             dtype=rollout_dtype("auto", torch.device("cpu")))
    episodes: list[Any] = []
    try:
        summary = await evaluate_policy(tasks, env, policy.generate, tokenizer, config, k=1, greedy=True,
                                        seed=args.seed, on_rollout=episodes.append)
    finally:
        await policy.aclose()
    return summary, sorted(episodes, key=lambda r: r.trajectory.task_id)
