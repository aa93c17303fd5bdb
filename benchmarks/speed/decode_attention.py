"""The lean decode step's attention over rows of mixed lengths, variant by variant, interleaved in one process.

    python benchmarks/speed/decode_attention.py [--rows 48] [--shortest 200] [--longest 2000] [--reps 5]

`LeanLlama.decode` (SmolLM2, bf16, the engine's serving dtype on a CPU with native bf16) over a slot cache whose
rows hold random keys and values (a step's cost does not depend on their values, and no prompt is prefilled).
Cases: `mixed` rows draw their lengths uniformly from [--shortest, --longest], in slot order; `sorted` are the
same lengths in ascending slot order; `equal` rows all hold their mean length, the same tokens as `mixed` with
no padding past the cache's last block of 128 columns, so `equal` under `before` is as low as a perfectly
ragged attention could bring `mixed`. The engine attends every row over every allocated column (`before`); the
variants try to read less padding:

- `before`: `LeanLlama.decode` as the engine runs it: scores = queries @ keys^T in one baddbmm over the whole span;
- `keys_first`: scores = keys @ queries^T ([batch, span, group], the cache as the tall operand), softmax over
  the span axis (the same reads, another matmul layout);
- `sdpa_whole`: one SDPA call over the whole span under the mask;
- `sdpa_rows`: SDPA per row over its own columns only (SDPA reads a column slice in place; no padded column read);
- `sliced_runs`: runs of 8 neighbouring slots, batched matmuls over each run's longest row (a column slice,
  which oneDNN copies).

Variants and cases alternate within each repeat and the minimum over repeats is reported, so a loaded machine
slows all alike. Both clocks are reported: wall time, and the process's CPU time, which on shared cores at
`--threads 1` leaves out the time the step waited for a core. Prints one JSON line: ms per step per case and
variant, and each variant's ratio to `before`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import emit, load_avg  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.kv_slots import SlotCache  # noqa: E402
from engine.lean_llama import LeanLlama  # noqa: E402
from engine.models import load_model  # noqa: E402


class KeysFirst(LeanLlama):
    def _decode_attention(self, queries, keys, values, bias):
        rows, kv_heads, group, head_dim = queries.shape
        span = keys.shape[2]
        scores = torch.baddbmm(bias.transpose(1, 2), keys.reshape(rows * kv_heads, span, head_dim),
                               queries.reshape(rows * kv_heads, group, head_dim).transpose(1, 2), alpha=self.scaling)
        return torch.bmm(scores.softmax(dim=1).transpose(1, 2), values.reshape(rows * kv_heads, span, head_dim))


class SdpaWhole(LeanLlama):
    def _decode_bias(self, mask):
        return torch.zeros(mask.shape, dtype=self.embed.dtype).masked_fill_(~mask, float("-inf"))

    def _decode_attention(self, queries, keys, values, bias):
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias, scale=self.scaling)


class SdpaRows(LeanLlama):
    def _decode_bias(self, mask):
        return mask[:, 0, 0].sum(dim=-1).tolist()  # each row's columns

    def _decode_attention(self, queries, keys, values, columns):
        return torch.cat([F.scaled_dot_product_attention(queries[r:r + 1], keys[r:r + 1, :, :n], values[r:r + 1, :, :n],
                                                         scale=self.scaling) for r, n in enumerate(columns)])


class SlicedRuns(LeanLlama):
    RUN = 8

    def _decode_bias(self, mask):
        columns = mask[:, 0, 0].sum(dim=-1).tolist()
        runs = [(a, min(a + self.RUN, len(columns))) for a in range(0, len(columns), self.RUN)]
        return [(a, b, max(columns[a:b]), super(SlicedRuns, self)._decode_bias(mask[a:b, ..., :max(columns[a:b])]))
                for a, b in runs]

    def _decode_attention(self, queries, keys, values, runs):
        return torch.cat([super(SlicedRuns, self)._decode_attention(queries[a:b], keys[a:b, :, :n], values[a:b, :, :n],
                                                                    bias) for a, b, n, bias in runs])


VARIANTS = {"before": LeanLlama, "keys_first": KeysFirst, "sdpa_whole": SdpaWhole, "sdpa_rows": SdpaRows,
            "sliced_runs": SlicedRuns}
BEFORE = "before"


def filled_cache(model, lengths: list[int], generator: torch.Generator) -> SlotCache:
    cache = SlotCache(model.config, model.dtype, max_rows=len(lengths), max_columns=model.config.max_position_embeddings)
    cache.reserve(len(lengths), max(lengths) + 1)
    for buffer in cache.keys + cache.values:
        buffer.normal_(generator=generator)
    cache.lengths = torch.tensor(lengths, dtype=torch.long)
    cache.rows = len(lengths)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--shortest", type=int, default=200)
    parser.add_argument("--longest", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    model, _ = load_model(args.model, dtype=getattr(torch, args.dtype))
    mixed = torch.randint(args.shortest, args.longest + 1, (args.rows,), generator=generator).tolist()
    cases = {"mixed": mixed, "sorted": sorted(mixed), "equal": [sum(mixed) // len(mixed)] * len(mixed)}
    caches = {name: filled_cache(model, lengths, generator) for name, lengths in cases.items()}
    names = args.variants.split(",")
    forwards = {}
    for name in names:  # each fuses the (already fused) weights again: views of the same storage
        forwards[name] = VARIANTS[name](model)
    tokens = torch.full((args.rows,), 100)
    result = {"benchmark": "decode_attention", "model": args.model, "dtype": args.dtype, "rows": args.rows,
              "lengths": [args.shortest, args.longest], "mean_length": sum(mixed) / len(mixed),
              "columns": {name: cache.capacity[1] for name, cache in caches.items()}, "threads": args.threads,
              "reps": args.reps, "load_average_start": load_avg()}

    def step(variant: str, case: str) -> None:
        cache = caches[case]
        mask = cache.begin_decode()
        try:
            forwards[variant].decode(tokens, cache, mask)
        finally:
            cache.end_decode()
        cache.lengths -= 1  # the same lengths every step: repeats stay comparable

    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    best: dict[str, dict[str, dict[str, float]]] = {clock: {case: {} for case in cases} for clock in clocks}
    with torch.inference_mode():
        for variant in names:
            for case in cases:
                step(variant, case)  # warm-up
        for _ in range(args.reps):
            for variant in names:
                for case in cases:
                    began = {clock: read() for clock, read in clocks.items()}
                    step(variant, case)
                    for clock, read in clocks.items():
                        times = best[clock][case]
                        times[variant] = min(times.get(variant, float("inf")), read() - began[clock])
    for clock in clocks:
        result[f"{clock}_ms"] = {case: {v: round(s * 1000, 1) for v, s in times.items()}
                                 for case, times in best[clock].items()}
        if BEFORE in names:
            result[f"{clock}_ratio_to_before"] = {case: {v: round(s / times[BEFORE], 3)
                                                            for v, s in times.items()}
                                                     for case, times in best[clock].items()}
    result["load_average_end"] = load_avg()
    emit(result, args.out)


if __name__ == "__main__":
    main()
