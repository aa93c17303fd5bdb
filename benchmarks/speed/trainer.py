"""Trainer speed: seconds per GRPO step and its time shares, before and after the update levers, in one run.

    .venv/bin/python benchmarks/speed/trainer.py [--model smollm2|tiny] [--tasks 8] [--n 4] [--steps 2]
                                                 [--levers] [--rollout-rates] [--overlap] [--only-after]

Starts a real env service (the `signal` environment, two turns) on a free port and runs training steps
with the local trainer twice, back to back on the same machine: `before` with the update levers off
(vocabulary projection at every position, unsorted micro-batches, old log-probs recomputed, fp32) and
`after` with the defaults. The two runs start from the same weights and seed; their rollouts differ
after the first update only through the updates themselves.

`--levers` adds an update-only measurement: one batch of real rollouts, then `PolicyUpdater.update`
on identical copies of the model with the levers switched on one at a time (then bf16, then LoRA,
each on top of the others), so each lever's share of the update time is seen without rollout noise.
`--rollout-rates` adds rollout tokens/s batched vs one episode at a time (the earlier benchmark).
`--overlap` adds a third run, the defaults with `trainer.overlap` (the next step's rollouts collected
during this step's update); its time shares count only the rollout time the step still waited for,
and `hidden_collection_s_per_step` is the collection time the update covered.
Prints one JSON line; the machine's load average (`os.getloadavg`) is in it, since other processes
on a shared machine move every number here.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import load_avg  # noqa: E402
from benchmarks.speed.trainer_vs_trl import SIGNAL as LOOKUP_SIGNAL  # noqa: E402
from common.schemas import Task  # noqa: E402
from engine.models import load_model  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer import lora  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.local import LocalTrainer  # noqa: E402
from trainer.lora import LoraSettings  # noqa: E402
from trainer.loss import PolicyLossConfig  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.policy import InProcessPolicy  # noqa: E402
from trainer.rollout import RolloutConfig, collect_groups  # noqa: E402
from trainer.step_batch import StepBatch  # noqa: E402
from trainer.update import OptimConfig, PolicyUpdater  # noqa: E402

# The update levers off: what the trainer did before they existed.
LEVERS_OFF = {"logits": "full", "bucket_by_length": False, "reuse_rollout_logprobs": False, "dtype": "float32",
              "share_prompts": False, "pack": False, "fuse_old_logprobs": False}
SHARED = {"logits": "response", "bucket_by_length": True, "share_prompts": True}
# Cumulative, in the order they were added; bf16 is measured on top of the other levers without reuse
# (reuse needs fp32 numerics).
LEVER_STEPS: list[tuple[str, dict[str, Any]]] = [
    ("baseline", {}),
    ("response_logits", {"logits": "response"}),
    ("bucket_by_length", {"logits": "response", "bucket_by_length": True}),
    ("reuse_rollout_logprobs", {"logits": "response", "bucket_by_length": True, "reuse_rollout_logprobs": True}),
    ("share_prompts", {**SHARED, "reuse_rollout_logprobs": True}),
    ("pack", {**SHARED, "reuse_rollout_logprobs": True, "pack": True}),
    # A bf16 rollout engine (`policy.dtype: auto` on a native-bf16 CPU): its log-probs are not reused, so the
    # update recomputes them; then the first minibatch's from its own forward; then bf16 autocast as well.
    ("pack_recompute", {**SHARED, "pack": True}),
    ("pack_recompute_fused", {**SHARED, "pack": True, "fuse_old_logprobs": True}),
    ("pack_fused_bf16_autocast", {**SHARED, "pack": True, "fuse_old_logprobs": True, "dtype": "bfloat16"}),
    # LoRA (r 16 on every linear layer) on top of the fp32 levers with reuse: the adapters train, the base is frozen.
    ("lora_r16", {**SHARED, "reuse_rollout_logprobs": True, "pack": True}),
]


def rollout_config(args: argparse.Namespace, concurrency: int = 64) -> RolloutConfig:
    return RolloutConfig(env="signal", n=args.n, max_turns=1 if args.lookup else 2, max_new_tokens=args.max_new_tokens, max_context=1024,
                         concurrency=concurrency)


async def rollout_rate(url: str, args: argparse.Namespace, tasks: int, concurrency: int) -> dict:
    model, tok = load_model(args.model)
    policy = InProcessPolicy(model, tok, max_batch=64)
    env = EnvPeer(url)
    try:
        ids = (await env.task_ids("signal", "train"))[:tasks]
        started = time.monotonic()
        groups = await collect_groups([Task(task_id=i, env_type="signal") for i in ids], env, policy.generate, tok,
                                      rollout_config(args, concurrency), seed=0)
        seconds = time.monotonic() - started
        tokens = sum(r.generated_tokens for g in groups for r in g)
        return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                "episodes": sum(len(g) for g in groups), "max_rows_in_batch": policy.stats.max_rows_in_batch}
    finally:
        await policy.aclose()
        await env.aclose()


def trainer_config(args: argparse.Namespace, url: str, optim: dict[str, Any], overlap: bool = False,
                   rollout_dtype: str = "auto") -> TrainerConfig:
    return TrainerConfig.model_validate({
        "model": args.model, "steps": args.steps, "tasks_per_step": args.tasks, "seed": 0, "overlap": overlap,
        "output_dir": tempfile.mkdtemp(prefix="bench-trainer-"), "progress": False, "tensorboard": False,
        "plot": False,
        "rollout": {"env": "signal", "n": args.n, "max_turns": 1 if args.lookup else 2, "max_new_tokens": args.max_new_tokens,
                    "max_context": 1024},
        "policy": {"dtype": rollout_dtype},
        "optim": {"lr": 1e-6, "minibatches": 2, "micro_batch_size": 4, **optim},
        "services": {"env_url": url}, "eval": {"before": False, "after": False}, "ray": {"enabled": False}})


def step_times(history: list[dict[str, float]]) -> dict[str, Any]:
    steps = [h for h in history if "time/step_s" in h]
    total = sum(h["time/step_s"] for h in steps)

    def summed(key: str) -> float:
        return sum(h.get(key, 0.0) for h in steps)

    # The step waits `wait_s` for its batch: all of rollout + judge when sequential, only what the previous
    # update did not cover with `overlap`; that wait is split between rollout and judge by their durations.
    collect = summed("time/rollout_s") + summed("time/judge_s")
    waited = summed("time/wait_s") / collect if collect else 0.0
    shares = {"rollout": round(summed("time/rollout_s") * waited / total, 3),
              "judge": round(summed("time/judge_s") * waited / total, 3)}
    shares.update({name: round(summed(key) / total, 3) for name, key in
                   (("update", "time/update_s"), ("weight_sync", "time/weight_sync_s"),
                    ("feedback", "time/feedback_s"))})
    # judge and feedback are 0 here: grpo needs no step labels and no peer services are configured.
    shares["waiting"] = max(0.0, round(1.0 - sum(shares.values()), 3))  # time outside the timed parts
    per_step = max(len(steps), 1)
    tokens = sum(h.get("update/tokens", 0.0) for h in steps)
    return {"steps": len(steps), "seconds_per_step": round(total / per_step, 2),
            "rollout_s_per_step": round(sum(h["time/rollout_s"] for h in steps) / per_step, 2),
            "update_s_per_step": round(sum(h["time/update_s"] for h in steps) / per_step, 2),
            "update_s_each": [round(h["time/update_s"], 2) for h in steps],
            "update_ms_per_training_token": round(1000 * sum(h["time/update_s"] for h in steps) / max(tokens, 1), 2),
            "training_tokens_per_step": round(tokens / per_step, 1),
            "reused_old_logprob_frac": round(sum(h.get("update/reused_old_logprob_frac", 0.0) for h in steps)
                                             / per_step, 3),
            "hidden_collection_s_per_step": round((collect - summed("time/wait_s")) / max(len(steps), 1), 2),
            "time_share": shares}


async def update_levers(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One batch of real rollouts, then updates per lever setting on identical model copies.

    The settings run interleaved `--repeats` times (A B C ... A B C ...), and the minimum and the
    median are reported: on a shared machine the minimum is the least disturbed measurement.
    """
    model, tok = load_model(args.model)
    policy = InProcessPolicy(model, tok, max_batch=64)
    env = EnvPeer(url)
    try:
        ids = (await env.task_ids("signal", "train"))[:args.lever_tasks]
        groups = await collect_groups([Task(task_id=i, env_type="signal") for i in ids], env, policy.generate, tok,
                                      rollout_config(args), seed=0)
    finally:
        await policy.aclose()
        await env.aclose()
    config = trainer_config(args, url, {})
    batch = StepBatch(groups, exact_logprobs=True)
    batch.estimate(config.advantage.estimator, config.advantage.estimator_config(), 0)
    samples = batch.samples()
    trained = sum(sum(s.loss_mask) for s in samples)
    out: dict[str, Any] = {
        "samples": len(samples), "repeats": args.repeats, "trained_tokens": trained,
        "mean_prompt_tokens": round(sum(len(s.prompt_ids) for s in samples) / len(samples), 1),
        "mean_response_tokens": round(sum(len(s.response_ids) for s in samples) / len(samples), 1),
        "max_length": max(s.length for s in samples)}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    wanted = set(args.lever_names.split(",")) if args.lever_names else {name for name, _ in LEVER_STEPS}
    steps = [(name, levers) for name, levers in LEVER_STEPS if name in wanted]
    seconds: dict[str, list[float]] = {name: [] for name, _ in steps}
    for _ in range(args.repeats):
        for name, levers in steps:
            optim = OptimConfig(lr=1e-6, minibatches=2, micro_batch_size=4, **{**LEVERS_OFF, **levers})
            trainable = copy.deepcopy(model)
            if name.startswith("lora"):
                trainable = lora.wrap(trainable, LoraSettings())
            updater = PolicyUpdater(trainable, optim, PolicyLossConfig(), pad_id=pad, total_updates=1)
            started = time.monotonic()
            updater.update(samples, policy_version=0)
            seconds[name].append(time.monotonic() - started)
            del updater, trainable
    base = min(seconds[steps[0][0]])  # "baseline" below: the first setting timed (the levers off, unless left out)
    out["speedups_against"] = steps[0][0]
    for name, values in seconds.items():
        best = min(values)
        out[name] = {"update_s_min": round(best, 2), "update_s_median": round(statistics.median(values), 2),
                     "ms_per_training_token_min": round(1000 * best / max(trained, 1), 2),
                     "speedup_vs_baseline_min": round(base / best, 2), "all_s": [round(v, 2) for v in values]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--levers", action="store_true", help="also time updates per lever setting")
    parser.add_argument("--lookup", action="store_true",
                        help="signal's one-turn lookup mode of benchmarks/speed/trainer_vs_trl.py instead of two turns")
    parser.add_argument("--lever-names", help="comma-separated lever settings to time (default: all)")
    parser.add_argument("--lever-tasks", type=int, default=4, help="tasks in the lever batch (x n samples)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the lever updates")
    parser.add_argument("--no-steps", action="store_true", help="skip the before/after training steps")
    parser.add_argument("--rollout-rates", action="store_true", help="also time rollouts batched vs serial")
    parser.add_argument("--overlap", action="store_true", help="also the defaults with trainer.overlap on")
    parser.add_argument("--only-after", action="store_true", help="skip `before` (the levers off)")
    args = parser.parse_args()
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    signal = LOOKUP_SIGNAL if args.lookup else {}
    conf.write_text(json.dumps({"env_service": {"environments": {"signal": signal}}}))  # JSON is YAML
    result: dict[str, Any] = {"benchmark": "trainer", "model": args.model, "signal_turns": 1 if args.lookup else 2, "tasks_per_step": args.tasks, "n": args.n,
                              "max_new_tokens": args.max_new_tokens, "cpus": os.cpu_count(),
                              "loadavg_start": load_avg()}
    with run_service("env_service", ["--conf", str(conf)]) as service:
        if args.rollout_rates:
            batched = asyncio.run(rollout_rate(service.url, args, args.tasks, 64))
            serial = asyncio.run(rollout_rate(service.url, args, max(1, args.tasks // 4), 1))
            result.update({"rollout_tokens_per_s_batched": batched["tokens_per_s"],
                           "rollout_tokens_per_s_serial": serial["tokens_per_s"],
                           "batched_speedup": round(batched["tokens_per_s"] / max(serial["tokens_per_s"], 1e-9), 2),
                           "max_rows_in_batch": batched["max_rows_in_batch"]})
        # `before`: the levers off and the fp32 rollout engine; `after`: the defaults (rollout dtype auto).
        runs = [] if args.no_steps else [("before", LEVERS_OFF, False), ("after", {}, False)][args.only_after:]
        for label, optim, overlap in runs + ([("overlap", {}, True)] if args.overlap else []):
            config = trainer_config(args, service.url, optim, overlap, "float32" if label == "before" else "auto")
            history = asyncio.run(LocalTrainer(config).run())["history"]
            result[label] = step_times(history)
            result[f"loadavg_after_{label}"] = load_avg()
        if args.levers:
            result["update_levers"] = asyncio.run(update_levers(service.url, args))
            result["loadavg_end"] = load_avg()
    if "overlap" in result:
        result["overlap_step_speedup"] = round(result["after"]["seconds_per_step"]
                                               / result["overlap"]["seconds_per_step"], 2)
    if "before" in result:
        result["step_speedup"] = round(result["before"]["seconds_per_step"] / result["after"]["seconds_per_step"], 2)
        result["update_speedup"] = round(result["before"]["update_s_per_step"] / result["after"]["update_s_per_step"],
                                         2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
