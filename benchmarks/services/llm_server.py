"""Throughput of `llm_server`: tokens/s for 1 and for N concurrent chat requests, plus batching counters,
and N concurrent requests under a structured-output grammar against the same N free.

    python benchmarks/services/llm_server.py [--model smollm2] [--max-tokens 64] [--concurrency 8] [--dtype float32]
                                             [--url URL]

Starts `python -m llm_server` on a free 127.0.0.1 port (unless --url is given), warms it up, then
sends one request alone and N at once (greedy, `max_tokens` each; the prompts ask for long answers
so most rows run to `max_tokens`) and prints one JSON line: tokens/s for each, the speed-up, and the server's
own counters for the concurrent round (prefill batches, decode steps, rows per decode step).

Structured outputs: the same N questions with a `json_schema` response format whose one string field has
a minLength no row can reach in `max_tokens`, so constrained rows also run to `max_tokens` and the two
rounds generate the same tokens. Free and constrained rounds alternate (free, constrained, free,
constrained) so a drifting machine load hits both alike; reported: tokens/s of each, the slowdown, and
the server's mask time per constrained token (`/v1/stats`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO, load_1m  # noqa: E402
from tests.helpers import free_port  # noqa: E402

QUESTIONS = [
    "Describe the water cycle in detail.", "Explain how a bicycle works.", "Write a short story about a cat.",
    "Describe the city of Paris.", "Explain photosynthesis step by step.", "Write a poem about the sea.",
    "Describe how to bake bread.", "Explain why the sky is blue.", "Describe a day in the life of a farmer.",
    "Explain how computers store numbers.", "Write a letter to a friend about a trip.", "Describe the moon.",
    "Explain how rain forms.", "Describe a busy market.", "Explain how a plane flies.", "Describe winter.",
]


def _start_server(model: str, max_batch: int, dtype: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(tempfile.gettempdir()) / f"llm_server-bench-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "llm_server", "--port", str(port), "--model", model,
                                 "--max-batch", str(max_batch), "--dtype", dtype], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llm_server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"llm_server not healthy after 300 s; log: {log}")


# A JSON answer that cannot close before max_tokens: constrained rows generate as many tokens as free ones.
LONG_ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "minLength": 100_000}}, "required": ["answer"],
    "additionalProperties": False}}}


async def _round(client: httpx.AsyncClient, model: str, questions: list[str], max_tokens: int,
                 response_format: dict | None = None) -> tuple[int, float]:
    async def one(question: str) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                "temperature": 0}
        if response_format is not None:
            body["response_format"] = response_format
        response = await client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        return response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    tokens = await asyncio.gather(*[one(q) for q in questions])
    return sum(tokens), time.perf_counter() - start


async def _measure(url: str, model: str, max_tokens: int, concurrency: int) -> dict:
    load_start = load_1m()  # the machine may be shared: the numbers are only as quiet as this
    async with httpx.AsyncClient(base_url=url, timeout=1200) as client:
        await _round(client, model, QUESTIONS[:1], 4)  # warm-up: first-call allocations
        single_tokens, single_s = await _round(client, model, QUESTIONS[:1], max_tokens)
        before = (await client.get("/v1/stats")).json()
        batch_tokens, batch_s = await _round(client, model, (QUESTIONS * 4)[:concurrency], max_tokens)
        after = (await client.get("/v1/stats")).json()
        structured = await _structured(client, model, (QUESTIONS * 4)[:concurrency], max_tokens)
    delta = {k: after[k] - before[k] for k in ("requests", "prefill_batches", "decode_steps", "generated_tokens")}
    single_rate, batch_rate = single_tokens / single_s, batch_tokens / batch_s
    return {
        "benchmark": "llm_server", "model": model, "max_tokens": max_tokens, "cpus": os.cpu_count(),
        "load_1m_start": load_start, "load_1m_end": load_1m(),
        "single": {"tokens": single_tokens, "seconds": round(single_s, 2), "tokens_per_s": round(single_rate, 2)},
        f"concurrent_{concurrency}": {"tokens": batch_tokens, "seconds": round(batch_s, 2),
                                      "tokens_per_s": round(batch_rate, 2)},
        "speedup": round(batch_rate / single_rate, 2),
        "batching": {**delta, "rows_per_decode_step": round(delta["generated_tokens"] / max(1, delta["decode_steps"]), 2)},
        "max_rows_in_batch": after["max_rows_in_batch"],
        "structured": structured,
    }


async def _structured(client: httpx.AsyncClient, model: str, questions: list[str], max_tokens: int) -> dict:
    """Free vs json_schema-constrained rounds of the same questions, alternated twice."""
    await _round(client, model, questions[:1], 4, LONG_ANSWER)  # compiles the grammar once (then cached)
    before = (await client.get("/v1/stats")).json()["structured_outputs"]
    totals = {"free": [0, 0.0], "constrained": [0, 0.0]}
    for _ in range(2):
        for kind, fmt in (("free", None), ("constrained", LONG_ANSWER)):
            tokens, seconds = await _round(client, model, questions, max_tokens, fmt)
            totals[kind][0] += tokens
            totals[kind][1] += seconds
    after = (await client.get("/v1/stats")).json()["structured_outputs"]
    masked = after["constrained_tokens"] - before["constrained_tokens"]
    mask_s = after["mask_seconds"] - before["mask_seconds"]
    free_rate = totals["free"][0] / totals["free"][1]
    constrained_rate = totals["constrained"][0] / totals["constrained"][1]
    return {
        "rows": len(questions), "rounds_each": 2,
        "free": {"tokens": totals["free"][0], "seconds": round(totals["free"][1], 2),
                 "tokens_per_s": round(free_rate, 2)},
        "constrained": {"tokens": totals["constrained"][0], "seconds": round(totals["constrained"][1], 2),
                        "tokens_per_s": round(constrained_rate, 2)},
        "slowdown_pct": round(100 * (1 - constrained_rate / free_rate), 1),
        "mask_us_per_token": round(1e6 * mask_s / max(1, masked), 1),
        "mask_share_of_constrained_time_pct": round(100 * mask_s / totals["constrained"][1], 2),
        "engine": after["engine"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--url", default=None, help="measure a running server instead of starting one")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url, _ = _start_server(args.model, max(8, args.concurrency), args.dtype)
    try:
        result = asyncio.run(_measure(url.removesuffix("/v1"), args.model, args.max_tokens, args.concurrency))
        result["dtype"] = args.dtype if args.url is None else "unknown (--url)"
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
