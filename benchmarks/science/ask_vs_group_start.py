"""Asking against the group-start injection (issue 33): `experience.mode: action` vs `group_start` on flights v2
validation, at equal training steps, from the same pool and (optionally) the same warm start.

    .venv/bin/python benchmarks/science/ask_vs_group_start.py --name NAME [--model smollm2] [--steps 8] [--tasks-per-step 2]
        [--n 4] [--eta 0.5] [--ask-budget 2] [--ask-format auto] [--ask-reward none|paired_branch]
        [--warm-start none|environment] [--eval-tasks 40] [--seed-per-kind 4] [--out benchmarks/results/ask_vs_group_start]

1. Starts an env service (`flights: {version: 2, tiers: [1]}`) and an experience manager (heuristic summaries),
   and seeds one pool per arm, identically, from **train-split** references only (benchmarks/science/loop_probe.py's
   `seed_pool`: the first `--seed-per-kind` train tasks of every kind, replayed over HTTP). No validation task
   reaches a pool; the `action` arm's evaluation with asks checks that again (`trainer.asks.refuse_held_out`).
2. Trains each arm with `python -m trainer` (in-process, no Ray) for `--steps` steps on the environment's train
   split, the same estimator (`--estimator`: GRPO, or GiGPO for the paired branch), seed, optimizer and rollout
   settings: `group_start` gives round(n * eta) rollouts of a
   group the top hit's demonstration (`inject: turns`); `action` lists `search_experience` and lets the policy
   ask (`--ask-budget` per episode). `--warm-start environment` fine-tunes each arm on the environment's train
   references first (the same data and seed, so the same weights).
3. Evaluates greedily on the first `--eval-tasks` validation tasks before and after, without experience, and for
   the `action` arm also with asks on (`eval.asks`).

Per arm: the asking rate at the first and last training step, training success of the rollouts that asked and
of those that did not (from the run's rollout records), validation success (plain, and with asks), wall time,
and the paired-branch statistics where the run reports them (`experience/branch*` metrics and the summary's
counters, with `--ask-reward paired_branch`). Prints one JSON line and writes it to `<out>/<name>.json`; the runs stay in runs/ask_vs_group_start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, add_probe_arguments, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from benchmarks.science.loop_probe import seed_pool, trainer_process  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402

ENV_CONFIG = {"version": 2, "tiers": [1]}
ARMS = ("group_start", "action")


def trainer_conf(arm: str, env_url: str, em_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The run of one arm: everything equal but how experience reaches a rollout."""
    experience: dict[str, Any] = {"workspace": f"{args.name}-{arm}".replace("_", "-"), "inject": "turns",
                                  "summarize": False, "feedback": True, "summarize_mode": "heuristic",
                                  "mode": arm}
    if arm == "action":
        experience.update(ask_budget=args.ask_budget, ask_format=args.ask_format)
        if args.ask_reward != "none":  # the paired-branch credit (issue 33 part 3)
            experience["ask_reward"] = args.ask_reward
    conf: dict[str, Any] = {
        "model": args.model, "seed": args.seed, "steps": args.steps, "tasks_per_step": args.tasks_per_step,
        "train_split": "train", "output_dir": str(REPO / "runs" / "ask_vs_group_start" / args.name / arm),
        "progress": False, "tensorboard": False, "plot": False, "torch_threads": args.threads,
        "policy": {"max_batch": args.max_batch},
        "rollout": {"env": "flights", "template": "linear", "n": args.n, "max_turns": args.max_turns,
                    "max_context": args.max_context, "max_new_tokens": args.max_new_tokens,
                    "temperature": args.temperature, "experience_ratio": args.eta if arm == "group_start" else 0.0},
        "optim": {"lr": args.lr, "minibatches": 2, "micro_batch_size": 2},
        "advantage": {"estimator": args.estimator or ("gigpo" if args.ask_reward == "paired_branch" else "grpo")},
        "experience": experience,
        "eval": {"split": "validation", "tasks": args.eval_tasks, "k": 1, "greedy": True, "before": True,
                 "after": True, "every": 0, "asks": arm == "action"},
        "checkpoint": {"every": 0},
        "ray": {"enabled": False},
        "services": {"env_url": env_url, "experience_url": em_url},
    }
    if args.warm_start_checkpoint:  # both arms start from one shared warm start (no second fine-tuning)
        conf["warm_start"] = {"enabled": True, "from_checkpoint": str(Path(args.warm_start_checkpoint).resolve())}
    elif args.warm_start != "none":
        conf["warm_start"] = {"enabled": True, "source": args.warm_start, "max_tasks": args.warm_start_tasks}
    return {"trainer": conf}


def train(arm: str, env_url: str, em_url: str, args: argparse.Namespace) -> dict[str, Any]:
    conf = trainer_conf(arm, env_url, em_url, args)
    out = Path(conf["trainer"]["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    code, seconds = trainer_process(path, out.parent / f"{arm}.log", args.timeout_min * 60)
    seconds = round(seconds, 1)
    if code != 0 or not (out / "summary.json").is_file():
        return {"exit": code, "wall_s": seconds, "log": str(out.parent / f"{arm}.log")}
    return {"exit": code, "wall_s": seconds, **arm_result(out)}


def arm_result(out: Path) -> dict[str, Any]:
    """What one run did, read from its files: asking by step, success with and without an ask, evaluations."""
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    index = [json.loads(line) for line in (out / "rollouts" / "index.jsonl").read_text().splitlines() if line.strip()]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for entry in index:
        by_step.setdefault(int(entry["step"]), []).append(entry)
    steps = sorted(by_step)

    def ask_rate(step: int) -> float:
        rows = by_step[step]
        return round(sum(int(r.get("asks") or 0) > 0 for r in rows) / len(rows), 4)

    def success(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rollouts": len(rows), "success": round(sum(float(r["outcome"] or 0) >= 1.0 for r in rows)
                                                         / len(rows), 4) if rows else None}

    asked = [r for r in index if int(r.get("asks") or 0) > 0]
    plain = [r for r in index if not int(r.get("asks") or 0) > 0]
    last = next((m for m in reversed(metrics) if any(k.startswith("eval") for k in m)), {})
    nav = (summary.get("mechanisms") or {}).get("self_navigating") or {}
    return {
        "asking_rate": {"first_step": ask_rate(steps[0]), "last_step": ask_rate(steps[-1]),
                        "by_step": {s: ask_rate(s) for s in steps}} if steps else None,
        "train_success": {"asked": success(asked), "not_asked": success(plain)},
        "eval": {k: v for k, v in last.items() if k.startswith(("eval/", "eval_asks/"))},
        "eval_before_after": summary.get("eval"),
        "eval_with_asks": summary.get("eval_with_asks"),  # the action arm's evaluations with asks on
        "self_navigating": {k: nav.get(k) for k in ("mode", "retrievals", "hits", "injected_rollouts", "asks",
                                                     "asks_over_budget", "asking_rollouts", "ask_searches",
                                                     "ask_feedback_items")},
        # The paired-branch credit (ask_reward: paired_branch): its branches per step (`experience/branch*`
        # metrics: runs, failures, seconds, forks, the mean difference and the share positive) and over the run
        # (the summary's self_navigating `branch*` counters).
        "branch": {"by_step": {int(m["step"]): {k: v for k, v in m.items() if k.startswith("experience/branch")}
                               for m in metrics if any(k.startswith("experience/branch") for k in m)},
                   "run": {k: v for k, v in nav.items() if k.startswith("branch")}} if args_branch(nav) else None,
        "time_step_s": [round(m["time/step_s"], 2) for m in metrics if "time/step_s" in m],
    }


def args_branch(nav: dict[str, Any]) -> bool:
    """Whether the run made paired branches (its summary counts them)."""
    return any(k.startswith("branch") for k in nav)


async def seed_pools(env_url: str, em_url: str, args: argparse.Namespace) -> dict[str, Any]:
    env = EnvPeer(env_url, timeout=600)
    try:
        flights = FlightsEnvironment(ENV_CONFIG)
        return {arm: await seed_pool(env, flights, em_url, f"{args.name}-{arm}".replace("_", "-"),
                                     args.seed_per_kind, "python", 4000) for arm in ARMS}
    finally:
        await env.aclose()


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "ask_vs_group_start", "name": args.name, "env_config": ENV_CONFIG,
                              "split": "validation", "args": vars(args), "load_avg_start": load_avg()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "env.yaml").write_text(yaml.safe_dump({"env_service": {"environments": {"flights": ENV_CONFIG}}}))
        (tmp / "em.yaml").write_text(yaml.safe_dump({"experience_manager": {"summary": {"mode": "heuristic"},
                                                                            "retrieval": {"top_k": 2}}}))
        with run_service("env_service", ["--conf", str(tmp / "env.yaml"), "--log-level", "WARNING"],
                         timeout=300) as env_service, \
                run_service("experience_manager", ["--conf", str(tmp / "em.yaml"), "--store", str(tmp / "store"),
                                                   "--log-level", "WARNING"], timeout=300) as em:
            result["seeding"] = asyncio.run(seed_pools(env_service.url, em.url, args))
            for arm in args.arms.split(","):
                result[arm] = train(arm, env_service.url, em.url, args)
                _write(args, result)
    result["load_avg_end"] = load_avg()
    return result


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", default="smollm2", help="smollm2 (the measurement) or tiny (a smoke run)")
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, in order")
    parser.add_argument("--steps", type=int, default=8, help="training steps of each arm")
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--n", type=int, default=4, help="rollouts per task")
    parser.add_argument("--eta", type=float, default=0.5, help="group_start: the share of a group given experience")
    parser.add_argument("--ask-budget", type=int, default=2)
    parser.add_argument("--ask-format", choices=["auto", "tool", "tag"], default="auto")
    parser.add_argument("--ask-reward", choices=["none", "paired_branch"], default="none")
    parser.add_argument("--estimator", choices=["grpo", "gigpo"], default=None,
                        help="both arms' estimator (default: grpo; gigpo with --ask-reward paired_branch, whose credit "
                             "goes through the step-level path)")
    parser.add_argument("--warm-start", choices=["none", "environment"], default="none",
                        help="fine-tune each arm on the environment's train references first")
    parser.add_argument("--warm-start-tasks", type=int, default=90, help="train references of the warm start")
    parser.add_argument("--warm-start-checkpoint", default=None, help=(
        "a warm-started run's step-0 checkpoint (e.g. the ablation's w row, self-questioned references) that both "
        "arms load instead of fine-tuning"))
    parser.add_argument("--seed-per-kind", type=int, default=4, help="train references per task kind in each pool")
    add_probe_arguments(parser)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--timeout-min", type=float, default=90.0, help="per arm")
    parser.add_argument("--out", default="benchmarks/results/ask_vs_group_start")
    args = parser.parse_args()
    result = run(args)
    _write(args, result)
    print(json.dumps({k: v for k, v in result.items() if k != "seeding"}))


if __name__ == "__main__":
    main()
