"""Rollout/update overlap (`trainer.overlap`) against the sequential trainer: a paired comparison.

    .venv/bin/python benchmarks/speed/overlap.py --model tiny --seeds 0 1 2 --steps 20        # learns in minutes
    .venv/bin/python benchmarks/speed/overlap.py --model smollm2 --seeds 0 --steps 6 --tasks 4 --n 4

Per seed, three measurements with the same seed (so the same task batches and rollout seeds):
`off` trains `--steps` steps sequentially; `on` trains the same number of steps with overlap (equal
steps), then keeps training until its training time reaches the `off` run's (equal wall time: the
last step that still ends within it). Held-out success (greedy, the first `--eval-tasks` test tasks,
avg@1) is measured after each; training time counts the steps only, not the evaluations (the
overlapped run's in-flight batch is finished before each evaluation, and that wait is counted).

`--model tiny` trains the randomly initialised 2-layer model on the cue task of the learning test
(`signal` two turns, the cue repeated, one token per answer), where success moves from chance (1/4)
within the steps; `--model smollm2` trains SmolLM2 on single-turn lookup (`signal` turns 1), the
shape of `trainer_vs_trl.py` at a smaller size. Non-inferiority: mean over seeds of (on - off)
held-out success >= -0.05, at equal steps and at equal wall time. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import load_avg  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.local import LocalTrainer  # noqa: E402

MARGIN = 0.05
TINY_SIGNAL = {"fallback": "first_char", "system": "signal", "query": "go", "cue": "{signal}", "cue_repeat": 16}
LOOKUP_SIGNAL = {"options": ["north", "south", "east", "west", "up", "down", "left", "right"],
                 "labels": ["wind", "road", "river", "bird", "cloud", "signal", "flag", "smoke"],
                 "fields": 4, "turns": 1}


def trainer_config(args: argparse.Namespace, url: str, seed: int, overlap: bool, steps: int) -> TrainerConfig:
    if args.model == "tiny":  # the learning test's settings
        rollout = {"env": "signal", "n": args.n, "max_turns": 2, "max_new_tokens": 1, "max_context": 128,
                   "temperature": 1.0}
        optim = {"lr": 5e-3, "epochs": 2, "minibatches": 2, "micro_batch_size": 64}
        policy = {"max_batch": 64, "threads": args.threads}
    else:  # trainer_vs_trl's shape
        rollout = {"env": "signal", "n": args.n, "max_turns": 1, "max_new_tokens": 32, "max_context": 512,
                   "temperature": 1.0}
        optim = {"lr": args.lr, "minibatches": 2, "micro_batch_size": 4}
        policy = {"max_batch": 64}
    return TrainerConfig.model_validate({
        "model": args.model, "seed": seed, "steps": steps, "tasks_per_step": args.tasks, "overlap": overlap,
        "output_dir": tempfile.mkdtemp(prefix=f"bench-overlap-{'on' if overlap else 'off'}-"),
        "torch_threads": args.threads, "progress": False, "tensorboard": False, "plot": False,
        "rollout": rollout, "policy": policy, "optim": optim, "services": {"env_url": url},
        "eval": {"before": False, "after": False, "split": "test", "tasks": args.eval_tasks},
        "ray": {"enabled": False}})


async def finish_prefetch(trainer: LocalTrainer) -> float:
    """Wait for the overlapped run's in-flight batch (so no rollout runs during an evaluation)."""
    if trainer._prefetch is None:
        return 0.0
    started = asyncio.get_running_loop().time()
    await asyncio.shield(trainer._prefetch)
    return asyncio.get_running_loop().time() - started


async def run_off(args: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    trainer = LocalTrainer(trainer_config(args, url, seed, False, args.steps))
    await trainer.setup()
    try:
        history = [await trainer.train_step() for _ in range(args.steps)]
        train_s = sum(h["time/step_s"] for h in history)
        success = (await trainer.evaluate())["eval/avg@1"]
    finally:
        await trainer.close()
    return {"steps": args.steps, "train_s": round(train_s, 2), "held_out_success": round(success, 4),
            "reward_mean": round(statistics.mean(h.get("rollout/reward_mean", 0.0) for h in history), 4)}


async def run_on(args: argparse.Namespace, url: str, seed: int, budget_s: float) -> dict[str, Any]:
    """Overlap on: evaluated at `--steps` steps, then again at the last step within `budget_s` of training."""
    max_steps = args.steps * args.max_step_factor
    trainer = LocalTrainer(trainer_config(args, url, seed, True, max_steps))
    await trainer.setup()
    out: dict[str, Any] = {}
    try:
        history: list[dict[str, float]] = []
        train_s = 0.0
        while trainer.step < max_steps:
            metrics = await trainer.train_step()
            history.append(metrics)
            train_s += metrics["time/step_s"]
            mean_step = train_s / len(history)
            at_equal_steps = trainer.step == args.steps
            # Equal wall time: stop where one more (mean) step would pass the sequential run's time.
            at_budget = trainer.step >= args.steps and train_s + mean_step > budget_s
            if at_equal_steps or at_budget:
                train_s += await finish_prefetch(trainer)
                success = (await trainer.evaluate())["eval/avg@1"]
                point = {"steps": trainer.step, "train_s": round(train_s, 2), "held_out_success": round(success, 4)}
                if at_equal_steps:
                    out["equal_steps"] = point
                if at_budget:
                    out["equal_wall"] = point
                    break
        stale = [h.get("update/off_policy_sample_frac", 0.0) for h in history]
        out.update({
            "steps_run": len(history), "off_policy_sample_frac_mean": round(statistics.mean(stale), 3),
            "version_lag_max": max(h.get("rollout/version_lag_max", 0.0) for h in history),
            "importance_weight_mean": round(statistics.mean(
                [h["update/importance_weight_mean"] for h in history if "update/importance_weight_mean" in h]
                or [1.0]), 4),
            "wait_s_per_step": round(statistics.mean(h["time/wait_s"] for h in history), 3),
            "update_s_per_step": round(statistics.mean(h["time/update_s"] for h in history), 3),
            "reward_mean": round(statistics.mean(h.get("rollout/reward_mean", 0.0) for h in history), 4)})
    finally:
        await trainer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per step")
    parser.add_argument("--n", type=int, default=8, help="rollouts per task")
    parser.add_argument("--lr", type=float, default=1e-6, help="smollm2 only")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--max-step-factor", type=int, default=2, help="the equal-wall run stops by this x steps")
    args = parser.parse_args()
    signal = TINY_SIGNAL if args.model == "tiny" else LOOKUP_SIGNAL
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"signal": signal}}}))
    result: dict[str, Any] = {"benchmark": "overlap", "model": args.model, "steps": args.steps, "tasks": args.tasks,
                              "n": args.n, "eval_tasks": args.eval_tasks, "seeds": args.seeds,
                              "cpus": os.cpu_count(), "loadavg_start": load_avg(),
                              "runs": {}}
    with run_service("env_service", ["--conf", str(conf)]) as service:
        for seed in args.seeds:
            off = asyncio.run(run_off(args, service.url, seed))
            on = asyncio.run(run_on(args, service.url, seed, off["train_s"]))
            result["runs"][str(seed)] = {"off": off, "on": on}
            print(json.dumps({"seed": seed, "off": off, "on": on}), file=sys.stderr, flush=True)
    runs = list(result["runs"].values())
    for point in ("equal_steps", "equal_wall"):
        deltas = [r["on"][point]["held_out_success"] - r["off"]["held_out_success"] for r in runs if point in r["on"]]
        if deltas:
            result[f"delta_{point}"] = round(statistics.mean(deltas), 4)
            result[f"non_inferior_{point}"] = statistics.mean(deltas) >= -MARGIN
    result["step_time_ratio_off_over_on"] = round(
        statistics.mean(r["off"]["train_s"] / r["off"]["steps"] for r in runs)
        / statistics.mean(r["on"]["equal_steps"]["train_s"] / r["on"]["equal_steps"]["steps"] for r in runs), 3)
    result["loadavg_end"] = load_avg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
