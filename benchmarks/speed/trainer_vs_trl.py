"""Our local GRPO trainer against TRL's GRPOTrainer on identical single-turn work, in one run.

    .venv/bin/python benchmarks/speed/trainer_vs_trl.py [--steps 3] [--eval]      # needs `pip install .[bench]`

Both train SmolLM2-135M (fp32 weights, CPU) on `signal` in single-turn lookup mode (the readings are in the
question; the first answer is scored), with the same shape: 8 prompts x 4 completions per batch, 32
new tokens, temperature 1, two optimizer updates per batch (ours: `minibatches: 2`; TRL:
`steps_per_generation: 2` with batches of 16), lr 1e-6 constant, clip 0.2 / 0.28, no KL, token-mean
loss (TRL's `dapo`). Our trainer talks to a real env service over HTTP; TRL scores its completions
with the same environment class in process.

A "step" is one batch (generation, scoring, two optimizer updates). For TRL, the time inside
`_generate` is its rollout; the rest of a batch (old log-probs, rewards, forward/backward) is its update.
`--eval` adds held-out success (greedy, the first `--eval-tasks` test tasks) after training, scored
for both models by our evaluator through the same env service; use `--steps 20` for the issue's
comparison (long: about 20 x both step times). Prints one JSON line; TRL's speed options are in it.

Ours runs its defaults: the rollout engine in bf16 on a CPU with native bf16 (`--rollout-dtype float32` for
the fp32 engine TRL's `generate` uses), whose log-probs the update then recomputes. Update cost is given per
trained token (ours: loss-mask tokens; TRL: completion tokens) and per sequence token (prompt + completion
of every row, the measure of the issue's "about 15 ms").
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

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import load_avg  # noqa: E402
from common.schemas import ChatMessage, Task  # noqa: E402
from engine.models import load_model  # noqa: E402
from env_service.environments.signal import SignalEnvironment  # noqa: E402
from tests.helpers import run_service  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.local import LocalTrainer  # noqa: E402
from trainer.peers import EnvPeer  # noqa: E402
from trainer.policy import InProcessPolicy  # noqa: E402
from trainer.rollout import RolloutConfig, evaluate_policy  # noqa: E402

OPTIONS = ["north", "south", "east", "west", "up", "down", "left", "right"]
LABELS = ["wind", "road", "river", "bird", "cloud", "signal", "flag", "smoke"]
SIGNAL = {"options": OPTIONS, "labels": LABELS, "fields": 4, "turns": 1}
PROMPTS, COMPLETIONS, NEW_TOKENS, LR = 8, 4, 32, 1e-6


def rollout_config() -> RolloutConfig:
    return RolloutConfig(env="signal", n=COMPLETIONS, max_turns=1, max_new_tokens=NEW_TOKENS, max_context=512,
                         temperature=1.0)


async def held_out(url: str, model: Any, tok: Any, args: argparse.Namespace) -> float:
    policy, env = InProcessPolicy(model, tok, max_batch=64), EnvPeer(url)
    try:
        ids = (await env.task_ids("signal", "test"))[:args.eval_tasks]
        summary = await evaluate_policy([Task(task_id=i, env_type="signal", split="test") for i in ids], env,
                                        policy.generate, tok, rollout_config(), k=1, greedy=True)
        return round(summary.avg_at_k, 4)
    finally:
        await policy.aclose()
        await env.aclose()


def run_ours(url: str, args: argparse.Namespace) -> dict[str, Any]:
    config = TrainerConfig.model_validate({
        "model": args.model, "steps": args.steps, "tasks_per_step": PROMPTS, "seed": args.seed,
        "output_dir": args.ours_dir or tempfile.mkdtemp(prefix="bench-ours-"), "resume": bool(args.ours_dir),
        "checkpoint": {"every": 1 if args.ours_dir else 0, "keep": 1},
        # The trained policy, for `--eval-saved` (which evaluates with an fp32 engine, as TRL's model is).
        "export_dir": str(Path(args.ours_dir) / "export") if args.ours_dir else None,
        "progress": False, "tensorboard": False, "plot": False,
        "rollout": rollout_config().model_dump(), "policy": {"dtype": args.rollout_dtype},
        "optim": {"lr": LR, "epochs": 1, "minibatches": 2, "micro_batch_size": 4, "schedule": "constant",
                  **json.loads(args.optim)},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0},
        "services": {"env_url": url}, "eval": {"before": False, "after": args.eval, "split": "test",
                                               "tasks": args.eval_tasks},
        "ray": {"enabled": False}})
    result = asyncio.run(LocalTrainer(config).run())
    steps = [h for h in result["history"] if "time/step_s" in h]
    n = len(steps)
    update_s = sum(h["time/update_s"] for h in steps)
    tokens = sum(h["update/tokens"] for h in steps)
    sequence = sum(h.get("update/sequence_tokens", 0.0) for h in steps)
    out = {"steps": n, "seconds_per_step": round(sum(h["time/step_s"] for h in steps) / n, 2),
           "rollout_s_per_step": round(sum(h["time/rollout_s"] for h in steps) / n, 2),
           "update_s_per_step": round(update_s / n, 2),
           "update_ms_per_training_token": round(1000 * update_s / max(tokens, 1), 2),
           "update_ms_per_sequence_token": round(1000 * update_s / max(sequence, 1), 2),
           "training_tokens_per_step": round(tokens / n, 1),
           "reward_mean": round(sum(h["rollout/reward_mean"] for h in steps) / n, 4),
           "reused_old_logprob_frac": round(sum(h.get("update/reused_old_logprob_frac", 0.0) for h in steps) / n, 3),
           "fused_old_logprob_frac": round(sum(h.get("update/fused_old_logprob_frac", 0.0) for h in steps) / n, 3),
           "rollout_dtype": config.policy.dtype,
           "optim": config.optim.model_dump(include={"logits", "bucket_by_length", "dtype",
                                                     "reuse_rollout_logprobs", "micro_batch_size",
                                                     "share_prompts", "pack", "fuse_old_logprobs"})}
    if args.eval:
        out["held_out_success"] = round(result["history"][-1]["eval/avg@1"], 4)
    return out


def run_trl(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import __version__ as trl_version

    env = SignalEnvironment(SIGNAL)
    rows = []
    for task_id in env.task_ids("train"):
        messages = env.create(task_id).reset()
        rows.append({"prompt": [{"role": m.role, "content": m.text()} for m in messages], "task_id": task_id})

    def reward(prompts: list, completions: list, task_id: list[str], **_: Any) -> list[float]:
        out = []
        for completion, tid in zip(completions, task_id, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            out.append(float(env.create(tid).step(ChatMessage(role="assistant", content=text)).reward))
        return out

    class TimedGRPO(GRPOTrainer):
        """Times the generation inside each batch and counts its completion tokens."""

        generate_s: list[float] = []
        generated_tokens: list[int] = []
        sequence_tokens: list[int] = []  # prompt + completion tokens of the batch's rows

        def _generate(self, prompts: list):
            started = time.monotonic()
            out = super()._generate(prompts)
            self.generate_s.append(time.monotonic() - started)
            self.generated_tokens.append(sum(len(ids) for ids in out[1]))
            self.sequence_tokens.append(sum(len(p) + len(c) for p, c in zip(out[0], out[1], strict=True)))
            return out

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.rewards: list[float] = []

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            self.marks.append(time.monotonic())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.marks.append(time.monotonic())

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict | None = None, **k: Any) -> None:
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    model, tok = load_model(args.model)
    out_dir = args.trl_dir or tempfile.mkdtemp(prefix="bench-trl-")
    resume = args.trl_dir is not None and any(Path(out_dir).glob("checkpoint-*"))
    grpo = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
        per_device_train_batch_size=PROMPTS * COMPLETIONS // 2, gradient_accumulation_steps=1,
        steps_per_generation=2, num_generations=COMPLETIONS, num_iterations=1,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        epsilon=0.2, epsilon_high=0.28, beta=0.0, loss_type="dapo", scale_rewards="group",
        max_steps=2 * args.steps, logging_steps=1, report_to="none",
        # `--trl-dir`: a checkpoint after every batch (its two updates), so a stopped run resumes there.
        save_strategy="steps" if args.trl_dir else "no", save_steps=2, save_total_limit=1,
        dataloader_num_workers=0, disable_dropout=True,
        # TRL turns activation checkpointing on by default; it trades compute for memory, which a
        # 135M model on a 128 GiB host does not need, so the comparison is against TRL's faster setting.
        gradient_checkpointing=args.trl_gradient_checkpointing)
    clock = StepClock()
    trainer = TimedGRPO(model=model, reward_funcs=reward, args=grpo, train_dataset=Dataset.from_list(rows),
                        processing_class=tok, callbacks=[clock])
    trainer.train(resume_from_checkpoint=True if resume else None)
    if args.save_trl:  # so a held-out evaluation cut off by a time limit can be run later (--eval-saved)
        trainer.save_model(args.save_trl)
        tok.save_pretrained(args.save_trl)
    batches = [clock.marks[i + 2] - clock.marks[i] for i in range(0, len(clock.marks) - 2, 2)]
    n = len(batches)
    total, gen = sum(batches), sum(TimedGRPO.generate_s[:n])
    tokens = sum(TimedGRPO.generated_tokens[:n])
    sequence = sum(TimedGRPO.sequence_tokens[:n])
    out = {"steps": n, "seconds_per_step": round(total / n, 2), "rollout_s_per_step": round(gen / n, 2),
           "update_s_per_step": round((total - gen) / n, 2),
           "update_ms_per_training_token": round(1000 * (total - gen) / max(tokens, 1), 2),
           "update_ms_per_sequence_token": round(1000 * (total - gen) / max(sequence, 1), 2),
           "training_tokens_per_step": round(tokens / n, 1),
           "reward_mean": round(sum(clock.rewards) / max(len(clock.rewards), 1), 4),
           "trl_version": trl_version, "resumed": resume,
           "speed_options": {k: getattr(grpo, k) for k in (
               "use_vllm", "use_transformers_paged", "use_transformers_continuous_batching", "cache_implementation",
               "gradient_checkpointing", "bf16", "torch_compile", "per_device_train_batch_size",
               "steps_per_generation", "generation_batch_size")}}
    if args.eval:
        out["held_out_success"] = asyncio.run(held_out(url, trainer.model.eval(), tok, args))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3, help="batches (each: 32 completions, 2 optimizer updates)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="smollm2", help="smollm2, or tiny for a smoke run")
    parser.add_argument("--eval", action="store_true", help="held-out success after training, for both")
    parser.add_argument("--eval-tasks", type=int, default=64)
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="keep TRL's default activation checkpointing (slower)")
    parser.add_argument("--only", choices=["ours", "trl"], help="run one side (for debugging)")
    parser.add_argument("--save-trl", help="write TRL's trained model to this folder")
    parser.add_argument("--rollout-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="our in-process engine's weights (auto: bf16 on a CPU with native bf16)")
    parser.add_argument("--optim", default="{}", help="our optim overrides as JSON, e.g. '{\"dtype\": \"bfloat16\"}'")
    parser.add_argument("--ours-dir", help="our run's folder: a checkpoint every step, resumed when it has one")
    parser.add_argument("--trl-dir", help="TRL's output folder: a checkpoint every batch, resumed when it has one "
                                          "(the timings of a resumed run cover only its last part)")
    parser.add_argument("--eval-saved", help="only the held-out success of a saved model folder (then exit)")
    args = parser.parse_args()
    conf = Path(tempfile.mkdtemp()) / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {"environments": {"signal": SIGNAL}}}))
    result: dict[str, Any] = {"benchmark": "trainer_vs_trl", "model": args.model, "dtype": "float32",
                              "prompts": PROMPTS, "completions": COMPLETIONS, "new_tokens": NEW_TOKENS,
                              "optimizer_updates_per_step": 2, "task": "signal lookup, turns: 1",
                              "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                              "cpus": os.cpu_count(), "loadavg_start": load_avg()}
    with run_service("env_service", ["--conf", str(conf)]) as service:
        if args.eval_saved:
            model, tok = load_model(args.eval_saved)
            print(json.dumps({"model_dir": args.eval_saved, "eval_tasks": args.eval_tasks,
                              "held_out_success": asyncio.run(held_out(service.url, model.eval(), tok, args))}))
            return
        for side, run in (("ours", run_ours), ("trl", run_trl)):
            if args.only in (None, side):
                torch.manual_seed(args.seed)
                result[side] = run(service.url, args)
                result[f"loadavg_after_{side}"] = load_avg()
    if "ours" in result and "trl" in result:
        result["trl_over_ours_seconds_per_step"] = round(result["trl"]["seconds_per_step"]
                                                         / result["ours"]["seconds_per_step"], 2)
        result["trl_over_ours_update_per_token"] = round(result["trl"]["update_ms_per_training_token"]
                                                         / result["ours"]["update_ms_per_training_token"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
