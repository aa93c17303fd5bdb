"""The local trainer's own model code on an accelerator: in-process rollouts, the update's log-probs, one update.

Runs without Ray or any service, so it needs only torch, transformers and the project's pure-Python
dependencies: the first thing to run on a GPU machine, before the Ray trainer or veRL.
Checks, on the chosen device:
- the batching engine generates (n rows sampled together, per-row seeded generators) and reports log-probs;
- the update's recomputed log-probs equal the rollout's (fp32: max |delta|; bf16 autocast: mean |delta|);
- one PPO update changes the weights and gives finite metrics;
- a weight push into the engine bumps its policy version and generation still works.
Prints one JSON line.

    python benchmarks/speed/gpu_local.py [--model tiny] [--device cuda] [--rows 32] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from engine.models import load_model  # noqa: E402
from trainer.policy import InProcessPolicy, Sampling  # noqa: E402
from trainer.settings import OptimConfig, PolicyLossConfig  # noqa: E402
from trainer.update import PolicyUpdater, TrainSample  # noqa: E402

QUESTIONS = ["Name a colour.", "What is two plus two?", "Say hello to Ada.", "Which way does the river point?",
             "Book a flight to Paris.", "Cancel my order.", "What is the weather?", "Count to three."]


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


async def rollouts(policy: InProcessPolicy, prompts: list[list[int]], new_tokens: int) -> tuple[list, float]:
    began = time.perf_counter()
    outs = await asyncio.gather(*(policy.generate(p, Sampling(max_tokens=new_tokens, temperature=1.0, seed=i))
                                  for i, p in enumerate(prompts)))
    return outs, time.perf_counter() - began


def logprob_delta(model, tokenizer, samples: list[TrainSample], dtype: str, device: torch.device) -> torch.Tensor:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    updater = PolicyUpdater(model, OptimConfig(dtype=dtype, micro_batch_size=8), PolicyLossConfig(), pad_id=pad,
                            total_updates=1, device=device)
    scored = updater.score(model, samples)
    return torch.cat([(scored[i].float().cpu() - torch.tensor(s.rollout_logprobs)).abs()
                      for i, s in enumerate(samples)])


async def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    device = torch.device(args.device)
    model, tokenizer = load_model(args.model)
    model.to(device)
    prompts = [prompt_ids(tokenizer, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.rows)]

    policy = InProcessPolicy(model, tokenizer, max_batch=args.rows)
    await rollouts(policy, prompts[:2], 4)  # warm-up: kernels, allocator
    outs, seconds = await rollouts(policy, prompts, args.new_tokens)
    generated = sum(len(o.token_ids) for o in outs)
    samples = [TrainSample(p, o.token_ids, [1] * len(o.token_ids), [1.0 if i % 2 else -1.0] * len(o.token_ids),
                           rollout_logprobs=o.logprobs, policy_version=0)
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True)) if o.token_ids]

    fp32 = logprob_delta(model, tokenizer, samples, "float32", device)
    bf16 = logprob_delta(model, tokenizer, samples, "bfloat16", device)

    before = copy.deepcopy(model.state_dict())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    updater = PolicyUpdater(model, OptimConfig(lr=1e-4, micro_batch_size=8), PolicyLossConfig(), pad_id=pad,
                            total_updates=1, device=device)
    began = time.perf_counter()
    metrics = updater.update(samples, policy_version=0)
    update_s = time.perf_counter() - began
    moved = max(float((model.state_dict()[k].float() - v.float()).abs().max()) for k, v in before.items())
    version = await policy.load_weights(model)
    after, _ = await rollouts(policy, prompts[:4], 8)
    await policy.aclose()
    return {
        "benchmark": "gpu_local", "model": args.model, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "rows": args.rows, "new_tokens": args.new_tokens,
        "rollout_tokens": generated, "rollout_s": round(seconds, 3), "rollout_tok_s": round(generated / seconds, 1),
        "engine_device": str(next(policy.engine.model.parameters()).device),
        "logprob_fp32_max_abs_delta": float(fp32.max()), "logprob_fp32_mean_abs_delta": float(fp32.mean()),
        "logprob_bf16_mean_abs_delta": float(bf16.mean()), "logprob_tokens": int(fp32.numel()),
        "update_s": round(update_s, 3), "update_metrics_finite": all(map(lambda v: v == v, metrics.values())),
        "reused_old_logprob_frac": metrics.get("update/reused_old_logprob_frac"),
        "max_weight_change": moved, "policy_version_after_push": version,
        "generated_after_push": all(len(o.token_ids) > 0 for o in after),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
