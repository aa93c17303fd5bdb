"""Trainer throughput: rollout tokens/s batched vs one at a time, seconds per training step, time shares.

    .venv/bin/python benchmarks/trainer.py [--model smollm2|tiny] [--tasks 8] [--n 4] [--steps 2]

Starts a real env service (the `signal` environment) on a free port, runs rollouts through the
in-process policy with all episodes in flight (generation batched across them) and then with one
episode at a time, then runs training steps with the local trainer. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.models import load_model  # noqa: E402
from common.schemas import Task  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.local import LocalTrainer  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.policy import InProcessPolicy  # noqa: E402
from trainer.rollout import RolloutConfig, collect_groups  # noqa: E402


async def rollout_rate(url: str, model_name: str, tasks: int, n: int, concurrency: int, max_new: int) -> dict:
    model, tok = load_model(model_name)
    policy = InProcessPolicy(model, tok, max_batch=64)
    env = EnvPeer(url)
    try:
        ids = (await env.task_ids("signal", "train"))[:tasks]
        config = RolloutConfig(env="signal", n=n, max_turns=2, max_new_tokens=max_new, max_context=1024,
                               concurrency=concurrency)
        started = time.monotonic()
        groups = await collect_groups([Task(task_id=i, env_type="signal") for i in ids], env, policy.generate, tok,
                                      config, seed=0)
        seconds = time.monotonic() - started
        tokens = sum(r.generated_tokens for g in groups for r in g)
        return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                "episodes": sum(len(g) for g in groups), "max_rows_in_batch": policy.stats.max_rows_in_batch}
    finally:
        await policy.aclose()
        await env.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    conf.write_text("env_service:\n  environments:\n    signal: {}\n")
    with run_service("env_service", ["--conf", str(conf)]) as service:
        batched = asyncio.run(rollout_rate(service.url, args.model, args.tasks, args.n, 64, args.max_new_tokens))
        serial = asyncio.run(rollout_rate(service.url, args.model, max(1, args.tasks // 4), args.n, 1,
                                          args.max_new_tokens))
        out_dir = tempfile.mkdtemp(prefix="bench-trainer-")
        config = TrainerConfig.model_validate({
            "model": args.model, "steps": args.steps, "tasks_per_step": args.tasks, "output_dir": out_dir,
            "progress": False, "tensorboard": False, "plot": False,
            "rollout": {"env": "signal", "n": args.n, "max_turns": 2, "max_new_tokens": args.max_new_tokens,
                        "max_context": 1024},
            "optim": {"lr": 1e-6, "minibatches": 2, "micro_batch_size": 4},
            "services": {"env_url": service.url}, "eval": {"before": False, "after": False},
            "ray": {"enabled": False}})
        result = asyncio.run(LocalTrainer(config).run())
    steps = [h for h in result["history"] if "time/step_s" in h]
    total = sum(h["time/step_s"] for h in steps)
    shares = {name: round(sum(h.get(key, 0.0) for h in steps) / total, 3) for name, key in
              (("rollout", "time/rollout_s"), ("judge", "time/judge_s"), ("update", "time/update_s"),
               ("weight_sync", "time/weight_sync_s"), ("feedback", "time/feedback_s"))}
    # judge and feedback are 0 here: grpo needs no step labels and no peer services are configured.
    shares["waiting"] = max(0.0, round(1.0 - sum(shares.values()), 3))  # time outside the timed parts
    print(json.dumps({
        "benchmark": "trainer", "model": args.model, "tasks_per_step": args.tasks, "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "rollout_tokens_per_s_batched": batched["tokens_per_s"], "rollout_tokens_per_s_serial": serial["tokens_per_s"],
        "batched_speedup": round(batched["tokens_per_s"] / max(serial["tokens_per_s"], 1e-9), 2),
        "max_rows_in_batch": batched["max_rows_in_batch"],
        "seconds_per_training_step": round(total / max(len(steps), 1), 2),
        "rollout_s_per_step": round(sum(h["time/rollout_s"] for h in steps) / max(len(steps), 1), 2),
        "update_s_per_step": round(sum(h["time/update_s"] for h in steps) / max(len(steps), 1), 2),
        "time_share": shares,
    }))


if __name__ == "__main__":
    main()
