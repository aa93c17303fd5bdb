"""The local trainer on a GPU, in one prepared run: its engine, log-probs, one GRPO step, one warm-start step.

For each model (`smollm2-shape`: SmolLM2-135M's architecture, randomly initialised, no weights to fetch;
`tiny`: the test model built in code; `tiny-qwen2`: the same size as a Qwen2 model, with attention biases, which
the engine runs through the transformers forward instead of its lean Llama one, as it runs Qwen2.5), on CPU
and on the device (only CPU with `--device cpu`):
- log-probs of the same sequences (the CPU rollout's) on the device against CPU fp32, with fp32 and with
  bf16 autocast (max and mean |delta|), and the engine's rollout log-probs against the update's recompute;
- rollout tokens/s: the batching engine over `--rows` rows sampled together, `--new-tokens` each (EOS ignored,
  so every row has the same length), fp32 weights, and bf16 weights on a GPU;
- one GRPO step: advantages by the `grpo` estimator from a made-up reward, then `PolicyUpdater.update` (old
  log-probs, one PPO pass): update tokens/s (prompt and response tokens of every sample), weights moved,
  metrics finite; then the new weights pushed into the engine, which generates again;
- one warm-start step (`trainer.warm_start.fine_tune`, one batch of rollouts as supervised samples);
- peak GPU memory allocated during each phase (what the earlier phases left resident included).
A phase that fails is recorded (its error in the JSON) and the others still run; the exit status is 1 then.
Nothing here needs Ray, vLLM, FastAPI, Qdrant or a service: `gpu_check.sh` runs it where only torch,
transformers, accelerate, peft and httpx are installed, unpacking the few wheels it carries.

    python benchmarks/speed/gpu_check.py [--device cuda] [--model all|tiny|smollm2-shape] [--out FILE]

Writes one JSON file (default `benchmarks/results/gpu-check-<device>-<model>.json`) and prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.generation import SamplingParams  # noqa: E402
from engine.models import load_model, load_tokenizer  # noqa: E402
from estimators import AdvantageBatch, GrpoConfig, compute_advantages  # noqa: E402
from trainer.policy import InProcessPolicy  # noqa: E402
from trainer.settings import OptimConfig, PolicyLossConfig, WarmStartConfig  # noqa: E402
from trainer.templates import Segment  # noqa: E402
from trainer.update import PolicyUpdater, TrainSample  # noqa: E402
from trainer.warm_start import fine_tune  # noqa: E402

MODELS = ("smollm2-shape", "tiny", "tiny-qwen2")
QUESTIONS = ["Name a colour.", "What is two plus two?", "Say hello to Ada.", "Book a flight to Paris.",
             "Cancel my order.", "What is the weather?", "Count to three.", "Which way is north?"]
GROUP = 4  # rollouts per question: one GRPO group


def smollm2_shape(tokenizer: Any) -> Any:
    """SmolLM2-135M-Instruct's architecture (its config.json; RoPE's base left at the default: it changes no
    shape or cost) with random weights, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.eval()


def tiny_qwen2(tokenizer: Any) -> Any:
    """The tiny model's size as a Qwen2 model (q/k/v biases: not the lean forward's), seeded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def build(name: str) -> tuple[Any, Any]:
    """(model fp32 on CPU, tokenizer); the models built here read the tiny tokenizer's ids."""
    if name == "tiny":
        return load_model("tiny")
    tokenizer = load_tokenizer("tiny")
    return (smollm2_shape if name == "smollm2-shape" else tiny_qwen2)(tokenizer), tokenizer


def prompts(tokenizer: Any, rows: int) -> list[list[int]]:
    out = []
    for i in range(rows):
        text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[(i // GROUP) % len(QUESTIONS)]}],
                                             add_generation_prompt=True, tokenize=False)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


class Phases:
    """Runs each phase, timing it, recording its peak GPU memory and its error instead of stopping."""

    def __init__(self, budget_s: float) -> None:
        self.began, self.budget_s = time.perf_counter(), budget_s
        self.failed = False

    def run(self, record: dict[str, Any], name: str, work: Any) -> Any:
        if time.perf_counter() - self.began > self.budget_s:
            record[name] = {"skipped": f"past the {self.budget_s:g} s budget"}
            self.failed = True  # an incomplete check is not a passed one
            return None
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        try:
            result, facts = work()
        except Exception as exc:  # one broken phase must not hide what the others measure
            self.failed = True
            record[name] = {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc().splitlines()[-12:]}
            return None
        if cuda:
            torch.cuda.synchronize()
            facts["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        facts["seconds"] = round(time.perf_counter() - began, 3)
        record[name] = facts
        return result


def rollout(policy: InProcessPolicy, prompt_ids: list[list[int]], new_tokens: int) -> tuple[list[Any], dict]:
    engine = policy.engine
    warm = [engine.submit(p, SamplingParams(max_tokens=4, seed=0)) for p in prompt_ids[:2]]  # kernels, allocator
    for future in warm:
        future.result(timeout=600)
    sync()
    began = time.perf_counter()
    futures = [engine.submit(p, SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i, ignore_eos=True))
               for i, p in enumerate(prompt_ids)]
    outs = [f.result(timeout=600).completions[0] for f in futures]
    sync()
    seconds = time.perf_counter() - began
    tokens = sum(len(o.token_ids) for o in outs)
    return outs, {"rows": len(outs), "tokens": tokens, "tok_s": round(tokens / seconds, 1),
                  "weights": str(next(engine.model.parameters()).dtype).removeprefix("torch.")}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def grpo_samples(prompt_ids: list[list[int]], outs: list[Any]) -> list[TrainSample]:
    """The rollouts as training rows, advantages by the `grpo` estimator from a made-up reward in [0, 1]
    (the share of even token ids: it differs within a group, so every group carries signal)."""
    lengths = [len(o.token_ids) for o in outs]
    width = max(lengths)
    mask = torch.zeros((len(outs), width))
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    reward = torch.tensor([sum(t % 2 == 0 for t in o.token_ids) / max(len(o.token_ids), 1) for o in outs])
    batch = AdvantageBatch(response_mask=mask, step_ids=torch.zeros((len(outs), width), dtype=torch.long),
                           outcome=reward, group_index=[i // GROUP for i in range(len(outs))])
    advantages = compute_advantages("grpo", batch, GrpoConfig())
    return [TrainSample(p, list(o.token_ids), [1] * len(o.token_ids), advantages[i, :len(o.token_ids)].tolist(),
                        rollout_logprobs=list(o.token_logprobs), policy_version=0)
            for i, (p, o) in enumerate(zip(prompt_ids, outs, strict=True))]


def updater(model: Any, device: torch.device, pad_id: int, dtype: str = "float32", lr: float = 1e-5) -> PolicyUpdater:
    return PolicyUpdater(model, OptimConfig(lr=lr, micro_batch_size=8, minibatches=1, dtype=dtype),
                         PolicyLossConfig(), pad_id=pad_id, total_updates=1, device=device)


def scored(model: Any, samples: list[TrainSample], device: torch.device, pad_id: int, dtype: str) -> torch.Tensor:
    """Every sample's response log-probs under `model` on `device` (bf16: autocast), concatenated on CPU."""
    out = updater(model, device, pad_id, dtype).score(model, samples)
    return torch.cat([out[i].float().cpu() for i in range(len(samples))])


def deltas(values: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    diff = (values - reference).abs()
    return {"max_abs_delta": float(diff.max()), "mean_abs_delta": float(diff.mean()), "tokens": int(diff.numel())}


def check_model(name: str, devices: list[torch.device], rows: int, new_tokens: int, phases: Phases) -> dict:
    """Every phase of one model on each device, CPU first (its rollout's sequences are the log-prob reference)."""
    base, tokenizer = build(name)
    record: dict[str, Any] = {"parameters": sum(p.numel() for p in base.parameters())}
    run = Run(tokenizer, prompts(tokenizer, rows), rows, new_tokens, phases)
    for device in devices:
        record[device.type] = {}
        run.on(copy.deepcopy(base).to(device), device, record[device.type])
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


class Run:
    """One model's phases on one device after another, holding the CPU reference between them."""

    def __init__(self, tokenizer: Any, prompt_ids: list[list[int]], rows: int, new_tokens: int,
                 phases: Phases) -> None:
        self.tokenizer, self.prompt_ids, self.rows, self.new_tokens, self.phases = (tokenizer, prompt_ids, rows,
                                                                                     new_tokens, phases)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.reference: dict[str, Any] = {}  # the CPU rollout's samples and their CPU fp32 log-probs

    def on(self, model: Any, device: torch.device, where: dict[str, Any]) -> None:
        phases, pad = self.phases, self.pad
        policy = InProcessPolicy(model, self.tokenizer, max_batch=self.rows)
        try:
            outs = phases.run(where, "rollout_fp32", lambda: rollout(policy, self.prompt_ids, self.new_tokens))
            if outs is None:
                return
            samples = grpo_samples(self.prompt_ids, outs)
            own = phases.run(where, "score_fp32", lambda: (scored(model, samples, device, pad, "float32"), {}))
            if own is not None:  # the engine's log-probs against the update's forward, same device and weights
                engine = torch.tensor([x for s in samples for x in (s.rollout_logprobs or [])])
                where["engine_vs_update_logprobs_fp32"] = deltas(engine, own)
            if device.type == "cpu":
                self.reference.update(samples=samples, fp32=own)
            if self.reference.get("fp32") is not None:  # on CPU: bf16 autocast only (fp32 is the reference itself)
                for dtype in ("float32", "bfloat16") if device.type != "cpu" else ("bfloat16",):
                    phases.run(where, f"logprobs_vs_cpu_fp32_{dtype}", lambda d=dtype: (None, deltas(
                        scored(model, self.reference["samples"], device, pad, d), self.reference["fp32"])))
            if device.type == "cuda":
                bf16 = InProcessPolicy(model, self.tokenizer, max_batch=self.rows, dtype=torch.bfloat16)
                try:
                    phases.run(where, "rollout_bf16", lambda: rollout(bf16, self.prompt_ids, self.new_tokens))
                finally:
                    asyncio.run(bf16.aclose())
            phases.run(where, "grpo_step", lambda: grpo_step(model, policy, samples, self.prompt_ids, device, pad))
            phases.run(where, "warm_start_step", lambda: warm_start_step(model, samples, device))
        finally:
            asyncio.run(policy.aclose())


def grpo_step(model: Any, policy: InProcessPolicy, samples: list[TrainSample], prompt_ids: list[list[int]],
              device: torch.device, pad: int) -> tuple[None, dict]:
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    began = time.perf_counter()
    metrics = updater(model, device, pad).update(samples, policy_version=0)
    sync()
    seconds = time.perf_counter() - began
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    moved = max(float((model.state_dict()[k].float() - v.float()).abs().max()) for k, v in before.items())
    version = asyncio.run(policy.load_weights(model))
    after = [policy.engine.submit(p, SamplingParams(max_tokens=8, seed=1)) for p in prompt_ids[:4]]
    generated = all(f.result(timeout=600).completions[0].token_ids for f in after)
    return None, {"samples": len(samples), "tokens": tokens, "update_s": round(seconds, 3),
                  "update_tok_s": round(tokens / seconds, 1), "max_weight_change": moved,
                  "metrics_finite": all(math.isfinite(v) for v in metrics.values()),
                  "pg_loss": metrics.get("update/pg_loss"), "grad_norm": metrics.get("update/grad_norm"),
                  "optimizer_steps": metrics.get("update/optimizer_steps"),
                  "policy_version_after_push": version, "generated_after_push": generated}


def warm_start_step(model: Any, samples: list[TrainSample], device: torch.device) -> tuple[None, dict]:
    batch = [Segment(s.prompt_ids, list(s.response_ids), list(s.loss_mask), [0] * len(s.response_ids))
             for s in samples[:4]]
    report = fine_tune(model, batch, WarmStartConfig(enabled=True, epochs=1, batch_size=len(batch), lr=1e-5),
                       device, seed=0)
    losses = report["loss_curve"]
    return None, {"samples": len(batch), "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in batch),
                  "loss": losses[0] if losses else None,
                  "loss_finite": all(math.isfinite(x) for x in losses) and bool(losses)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="all", choices=["all", *MODELS])
    parser.add_argument("--rows", type=int, default=32, help="rows sampled together (groups of 4)")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per row")
    parser.add_argument("--budget-s", type=float, default=420, help="phases starting past this are skipped")
    parser.add_argument("--out", default=None, help="the JSON file (default under benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device cuda but torch {torch.__version__} sees no CUDA GPU: run on a GPU machine, "
              "or pass --device cpu", file=sys.stderr)
        return 2
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if args.device == "cuda" else [])
    phases = Phases(args.budget_s)
    import transformers

    result: dict[str, Any] = {
        "benchmark": "gpu_check", "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "cpu_threads": torch.get_num_threads(),
        "rows": args.rows, "new_tokens": args.new_tokens, "models": {},
    }
    for name in MODELS if args.model == "all" else (args.model,):
        result["models"][name] = check_model(name, devices, args.rows, args.new_tokens, phases)
    result["seconds"] = round(time.perf_counter() - phases.began, 1)
    result["ok"] = not phases.failed
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"gpu-check-{args.device}-{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
