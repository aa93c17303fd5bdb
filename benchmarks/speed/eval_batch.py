"""How fast is a held-out evaluation at each engine width, and where does its time go (prompts or decoding)?

    .venv/bin/python benchmarks/speed/eval_batch.py [--rows 32,128] [--prefix-cache-mb 0,1024] [--tasks 32] [--k 4]
        [--split validation] [--checkpoint runs/x/trainer/checkpoints] [--out benchmarks/results/eval-batch.json]

Starts `python -m env_service` with flights tier 1 (the quickstart's environment) and evaluates SmolLM2 through
the trainer's own path (`trainer.rollout.evaluate_policy`, what the quickstart's before and after evaluations
run) once per engine width and kept-cache budget (`policy.prefix_cache_mb`: a next turn resumes from its
last turn's cache), with as many episodes in flight as the engine has rows; the policy is SmolLM2, or a
trainer checkpoint of it (`--checkpoint`: a trained policy makes calls, so its episodes have more turns). The rollout sizes and the
sampling temperature are the quickstart's (`examples/quickstart.yaml`). Each sample is seeded, so every
configuration should give the same replies; the JSON says whether it did (floating-point differences between
batch shapes and kept caches may change a rare sampled token). Per width: wall time, the engine's prefill and
decode seconds, prompt tokens (computed, and copied as shared prefixes), generated tokens, the most rows seen
in one batch, avg@k. Prints one JSON line. Default split: validation (a timing run has no business on test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import yaml  # noqa: E402

from common.schemas import Task  # noqa: E402
from engine.models import load_model  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.policy import InProcessPolicy, engine_usage  # noqa: E402
from trainer.rollout import evaluate_policy, evaluation_progress  # noqa: E402
from trainer.settings import RolloutConfig  # noqa: E402


def quickstart_rollout() -> RolloutConfig:
    return RolloutConfig.model_validate(yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
                                        ["trainer"]["rollout"])


async def evaluate_at(width: int, prefix_cache_mb: int, model: Any, tokenizer: Any, env: EnvPeer, tasks: list[Task],
                      k: int, threads: int, seed: int) -> dict[str, Any]:
    rollout = quickstart_rollout().model_copy(update={"concurrency": width})
    policy = InProcessPolicy(model, tokenizer, max_batch=width, threads=threads, prefix_cache_mb=prefix_cache_mb)
    started = time.monotonic()
    try:
        summary = await evaluate_policy(tasks, env, policy.generate, tokenizer, rollout, k=k, greedy=False,
                                        seed=seed, on_rollout=evaluation_progress(len(tasks) * k, started))
    finally:
        await policy.aclose()
    wall = time.monotonic() - started
    stats = policy.stats
    return {"rows": width, "prefix_cache_mb": prefix_cache_mb, "wall_s": round(wall, 1), **engine_usage(stats),
            "turns_per_episode": round(sum(sum(v) for v in summary.per_task_steps.values()) / (len(tasks) * k), 3),
            "decode_tokens_per_s": round(stats.generated_tokens / max(stats.decode_seconds, 1e-9), 1),
            f"avg@{k}": round(summary.avg_at_k, 4), "invalid_action_rate": round(summary.invalid_action_rate, 4),
            "replies": summary.per_task_replies}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if args.checkpoint:
        from trainer.evaluate import load_checkpoint_model

        model, tokenizer, _ = load_checkpoint_model(args.checkpoint)
    else:
        model, tokenizer = load_model("smollm2")
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "env.yaml"
        conf.write_text(yaml.safe_dump({"env_service": {"environments": {"flights": {"tiers": [1]}}}}))
        with run_service("env_service", ["--conf", str(conf), "--log-level", "WARNING"], timeout=300) as service:
            env = EnvPeer(service.url)
            try:
                ids = (await env.task_ids("flights", args.split))[:args.tasks]
                tasks = [Task(task_id=t, env_type="flights", split=args.split) for t in ids]
                runs = [await evaluate_at(width, budget, model, tokenizer, env, tasks, args.k, args.threads, args.seed)
                        for width in args.rows for budget in args.prefix_cache_mb]
            finally:
                await env.aclose()
    replies = [run.pop("replies") for run in runs]
    return {"benchmark": "eval_batch", "model": args.checkpoint or "smollm2", "env": "flights tier 1", "split": args.split,
            "tasks": len(tasks), "k": args.k, "temperature": quickstart_rollout().temperature,
            "threads": args.threads, "load_average": load_avg(), "runs": runs,
            "same_replies_in_every_run": all(r == replies[0] for r in replies[1:]),
            "samples_that_differ_from_the_first_run": [
                sum(a != b for t in replies[0] for a, b in zip(replies[0][t], other[t], strict=True))
                for other in replies]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="32,128", help="engine widths, comma-separated")
    parser.add_argument("--prefix-cache-mb", default="1024", help="kept-cache budgets, comma-separated (0: off)")
    parser.add_argument("--checkpoint", default=None, help="a trainer checkpoint (file or folder) instead of SmolLM2")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the quickstart's trainer has 2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    args.prefix_cache_mb = [int(m) for m in args.prefix_cache_mb.split(",")]
    result = asyncio.run(main_async(args))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
