"""The engine's forward passes, transformers vs the lean Llama forward, interleaved in one process (A/B under load).

    python benchmarks/speed/forward.py [--rows 1,32] [--dtypes bfloat16,float32] [--reps 5] [--prefill-prompts 8]
                                       [--threads 2] [--cpu-time] [--profile]

Decode: one step (forward over the slot cache to logits) at each `--rows` count, every row at the rollout
benchmark's ~330-token context (held fixed). Prefill: `--prefill-prompts` distinct ~330-token prompts in one
right-padded forward (the engine's prefill group), to the last position's logits. Each variant is
dtype x forward (`hf`: the transformers model with the slot attention, the engine before; `lean`:
`engine.lean_llama`); variants alternate within each repeat and the minimum over repeats is reported, so a
loaded machine slows all alike. `--cpu-time` (with `--threads 1`) times by the process's CPU time instead
of the wall clock: on a machine loaded by other jobs, a 2-thread op waits for its descheduled thread, and the
wall clock then measures the scheduler more than the op. Also reports the best bf16/fp32 GEMM rate of the prefill's largest matmul
shape (the compute bound of a prefill) and prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import best_seconds, load_1m  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from benchmarks.speed.rollout import build_prompts  # noqa: E402
from engine.kv_slots import ATTENTION, SlotCache  # noqa: E402
from engine.lean_llama import LeanLlama  # noqa: E402
from engine.models import load_model  # noqa: E402


def gemm_gflops(dtype: torch.dtype, tokens: int = 2048, reps: int = 5) -> float:
    """Best rate of [tokens, 576] x [576, 1536] (SmolLM2's MLP up-projection shape), GFLOP/s."""
    x, w = torch.randn(tokens, 576).to(dtype), torch.randn(1536, 576).to(dtype)
    torch.nn.functional.linear(x, w)
    best = best_seconds(lambda: torch.nn.functional.linear(x, w), reps)
    return round(2 * tokens * 576 * 1536 / best / 1e9, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--prefill-prompts", type=int, default=8, help="0: no prefill variants")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cpu-time", action="store_true", help="time by CPU time (use with --threads 1)")
    parser.add_argument("--profile", action="store_true",
                        help="also a per-op profile (ms per step) of each lean decode variant")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]
    result: dict = {"benchmark": "forward", "threads": args.threads, "clock": clock.__name__, "load_1m_start": load_1m()}
    steps = {}
    with torch.inference_mode():
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            hf, tokenizer = load_model("smollm2", dtype=dtype)
            hf.set_attn_implementation(ATTENTION)
            lean_model = copy.deepcopy(hf)
            lean = LeanLlama(lean_model)
            prompt = build_prompts(tokenizer, 1, 1, 0)[0]
            result["context"] = len(prompt)
            for rows in rows_list:
                for forward in ("hf", "lean"):
                    cache = SlotCache(hf.config, dtype, rows, 2048)
                    cache.begin_prefill(1, len(prompt))
                    hf.get_decoder()(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None],
                                     past_key_values=cache, use_cache=True)
                    cache.end_prefill([len(prompt)])
                    for _ in range(rows - 1):
                        cache.duplicate(0)
                    steps[f"decode:{dtype_name}:{rows}:{forward}"] = _decode(hf, lean, forward, cache, rows)
            if args.prefill_prompts:
                prompts = build_prompts(tokenizer, args.prefill_prompts, 1, 0)
                result["prefill_tokens"] = sum(len(p) for p in prompts)
                for forward in ("hf", "lean"):
                    steps[f"prefill:{dtype_name}:{args.prefill_prompts}:{forward}"] = _prefill(hf, lean, forward,
                                                                                              prompts)
        best: dict[str, float] = {}
        for step in steps.values():
            step()  # warm-up
        for _ in range(args.reps):
            for name, step in steps.items():
                began = clock()
                step()
                best[name] = min(best.get(name, float("inf")), clock() - began)
        if args.profile:
            result["profile_ms_per_step"] = {name: _profile(step) for name, step in steps.items()
                                             if name.startswith("decode") and name.endswith(":lean")}
    result["ms"] = {name: round(s * 1000, 1) for name, s in best.items()}
    result["lean_speedup"] = {name.rsplit(":", 1)[0]: round(best[name] / best[name.rsplit(":", 1)[0] + ":lean"], 2)
                              for name in best if name.endswith(":hf")}
    result["gemm_gflops"] = {d: gemm_gflops(getattr(torch, d)) for d in args.dtypes.split(",")}
    result["load_1m_end"] = load_1m()
    print(json.dumps(result))


def _profile(step, steps: int = 5, top: int = 12) -> dict:
    """The ops that take the most self time, ms per step, plus the step's total and its count of op calls."""
    from torch.profiler import profile

    with profile() as prof:
        for _ in range(steps):
            step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    out = {e.key: round(e.self_cpu_time_total / 1000 / steps, 2) for e in events[:top]}
    out["total"] = round(sum(e.self_cpu_time_total for e in events) / 1000 / steps, 2)
    out["op_calls"] = sum(e.count for e in events) // steps
    return out


def _decode(hf, lean: LeanLlama, forward: str, cache: SlotCache, rows: int):
    tokens = torch.full((rows,), 100)

    def step() -> None:
        mask = cache.begin_decode()
        try:
            if forward == "lean":
                lean.decode(tokens, cache, mask)
            else:
                hf(input_ids=tokens[:, None], attention_mask=mask, position_ids=cache.lengths[:rows, None].clone(),
                   past_key_values=cache, use_cache=True)
        finally:
            cache.end_decode()
        cache.lengths -= 1  # the same context every step: repeats stay comparable

    return step


def _prefill(hf, lean: LeanLlama, forward: str, prompts: list[list[int]]):
    lengths = [len(p) for p in prompts]
    ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    last = torch.tensor(lengths) - 1
    cache = SlotCache(hf.config, next(hf.parameters()).dtype, len(prompts), 2048)

    def step() -> None:
        cache.begin_prefill(len(prompts), ids.shape[1])
        try:
            if forward == "lean":
                lean.prefill(ids, cache, last)
            else:
                hidden = hf.get_decoder()(input_ids=ids, position_ids=torch.arange(ids.shape[1]).expand_as(ids),
                                          past_key_values=cache, use_cache=True).last_hidden_state
                hf.get_output_embeddings()(hidden[torch.arange(len(prompts)), last])
        finally:
            cache.end_prefill(lengths)
        cache.remove(list(range(len(prompts))))

    return step


if __name__ == "__main__":
    main()
