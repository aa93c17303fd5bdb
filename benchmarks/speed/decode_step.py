"""One batched decode step of the rollout engine, lever by lever, interleaved in one process (A/B under load).

    python benchmarks/speed/decode_step.py [--rows 32] [--reps 5] [--context 330]

Each variant runs the engine's decode step (forward over the slot cache, lm_head, log-softmax, sampling) at
`--rows` rows of a `--context`-token prompt (prefilled once, copied to every row; the context is held fixed).
Variants: dtype (float32, bfloat16) x attention span (`span`: columns 0..longest row, the engine before;
`whole`: every allocated column, contiguous, the engine now) x sampler (`multinomial` per row, before;
`inverse_cdf`, batched, now). Variants alternate within each repeat and the minimum over repeats is
reported, so a loaded machine slows all alike. Prints one JSON line (ms per step and tokens/s per variant).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import load_1m  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from benchmarks.speed.rollout import build_prompts  # noqa: E402
from engine.kv_slots import ATTENTION, SlotCache  # noqa: E402
from engine.models import load_model  # noqa: E402
from engine.sampling import sample_rows  # noqa: E402


class SpanCache(SlotCache):
    """The cache before: decode attends over columns 0..longest row, a strided slice of each buffer."""

    def begin_decode(self) -> torch.Tensor:
        mask = super().begin_decode()
        self._span = int(self.lengths[:self.rows].max()) + 1
        return mask[..., :self._span]


def multinomial_rows(logits: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """The sampler before: torch.multinomial per row (one exponential draw per vocabulary entry)."""
    return [int(torch.multinomial(torch.softmax(logits[i], dim=-1), 1, generator=g))
            for i, g in enumerate(generators)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = [(dtype, span, sampler) for dtype in ("float32", "bfloat16") for span, sampler in
                (("span", "multinomial"), ("whole", "multinomial"), ("whole", "inverse_cdf"))]
    result: dict = {"benchmark": "decode_step", "rows": args.rows, "threads": args.threads,
                    "load_1m_start": load_1m()}
    states = {}
    with torch.inference_mode():
        for dtype in ("float32", "bfloat16"):
            model, tokenizer = load_model("smollm2", dtype=getattr(torch, dtype))
            model.set_attn_implementation(ATTENTION)
            prompt = build_prompts(tokenizer, 1, 1, 0)[0]
            result["context"] = len(prompt)
            for span in ("span", "whole"):
                cache = (SpanCache if span == "span" else SlotCache)(model.config, model.dtype, args.rows, 2048)
                cache.begin_prefill(1, len(prompt))
                try:
                    model.get_decoder()(input_ids=torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None],
                                        past_key_values=cache, use_cache=True)
                finally:
                    cache.end_prefill([len(prompt)])
                for _ in range(args.rows - 1):
                    cache.duplicate(0)
                states[(dtype, span)] = (model, cache)
        generators = [torch.Generator().manual_seed(i) for i in range(args.rows)]

        def step(dtype: str, span: str, sampler: str) -> None:
            model, cache = states[(dtype, span)]
            mask = cache.begin_decode()
            positions = cache.lengths[:args.rows, None].clone()
            try:
                out = model(input_ids=torch.full((args.rows, 1), 100), attention_mask=mask, position_ids=positions,
                            past_key_values=cache, use_cache=True)
            finally:
                cache.end_decode()
            cache.lengths -= 1  # the same context every step: variants stay comparable
            logits = out.logits[:, -1].float()
            torch.log_softmax(logits, dim=-1)
            if sampler == "multinomial":
                multinomial_rows(logits, generators)
            else:
                sample_rows(logits, [1.0] * args.rows, [1.0] * args.rows, generators)

        best: dict[str, float] = {}
        for variant in variants:
            step(*variant)  # warm-up
        for _ in range(args.reps):
            for variant in variants:
                began = time.perf_counter()
                step(*variant)
                best[":".join(variant)] = min(best.get(":".join(variant), float("inf")), time.perf_counter() - began)
    result["variants"] = {name: {"ms": round(s * 1000, 1), "tokens_per_s": round(args.rows / s, 1)}
                          for name, s in best.items()}
    result["load_1m_end"] = load_1m()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
