"""llm_server's resident memory under a long stream of multi-turn chats: where it grows, and what bounds it.

    .venv/bin/python benchmarks/services/llm_server_memory.py [--model tiny] [--rounds 40] [--out FILE]

Each variant starts its own `python -m llm_server` and sends the same seeded load, round after round: 16
three-turn conversations of fresh random words (every prompt a new length, as rollouts are) and 2 structured
(JSON-schema) calls, as the judge makes. After each round it reads the server's RSS. Variants, one server each:

- `default`: the server as it ships (bfloat16 on a CPU with AMX or avx512_bf16, where `dtype: auto` picks it);
- `float32`: `--dtype float32` (matrix products through MKL's sgemm, no oneDNN primitives);
- `onednn_caches_off`: bfloat16 with oneDNN's primitive cache and ideep's LRU cache both at their minimum
  (`ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`, `LRU_CACHE_CAPACITY=1`): each distinct matmul shape is compiled again
  instead of kept;
- `prefix_cache_off`: bfloat16 with `llm_server.prefix_cache_mb: 0` (no finished rows' caches kept).

Prints one JSON line: per variant, RSS at the first round, at the third of the run and at the end, the growth
from the third to the end, the seconds the rounds took, and the load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import emit, load_avg  # noqa: E402
from tests.helpers import run_service  # noqa: E402

WORDS = ("go north take key open door book flight cancel order find the cheapest price for passenger on date "
         "from to city seat class total answer tool result").split()
JUDGE_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": [f"step_{i}" for i in range(3)],
    "properties": {f"step_{i}": {"type": "object", "additionalProperties": False, "required": ["judgment"],
                                 "properties": {"judgment": {"type": "string", "enum": ["GOOD", "BAD"]}}}
                   for i in range(3)},
}
VARIANTS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "default": ([], {}, ""),
    "float32": (["--dtype", "float32"], {}, ""),
    "onednn_caches_off": ([], {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "LRU_CACHE_CAPACITY": "1"}, ""),
    "prefix_cache_off": ([], {}, "llm_server:\n  prefix_cache_mb: 0\n"),
}


async def conversation(client: httpx.AsyncClient, url: str, rng: random.Random, structured: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for _ in range(1 if structured else 3):
        messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))})
        body: dict[str, Any] = {"model": "served", "messages": messages, "max_tokens": 24, "temperature": 1.0}
        if structured:
            body["max_tokens"] = 64
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "j", "schema": JUDGE_SCHEMA}}
        reply = await client.post(f"{url}/v1/chat/completions", json=body)
        reply.raise_for_status()
        messages.append({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"] or ""})


async def drive(url: str, pid: int, rounds: int, seed: int) -> tuple[list[float], float]:
    rng, rss = random.Random(seed), []
    began = time.perf_counter()
    async with httpx.AsyncClient(timeout=300) as client:
        for _ in range(rounds):
            await asyncio.gather(*(conversation(client, url, rng, structured=k >= 16) for k in range(18)))
            rss.append(round(psutil.Process(pid).memory_info().rss / 2**20, 1))
    return rss, round(time.perf_counter() - began, 1)


def measure(name: str, model: str, rounds: int, seed: int, folder: Path) -> dict[str, Any]:
    args, env, conf = VARIANTS[name]
    if conf:
        path = folder / f"{name}.yaml"
        path.write_text(conf)
        args = [*args, "--conf", str(path)]
    with run_service("llm_server", ["--model", model, "--served-model-name", "served", *args], env=env,
                     timeout=300, log_dir=folder) as server:
        load_before = load_avg()
        rss, seconds = asyncio.run(drive(server.url, server.proc.pid, rounds, seed))
    third = rss[len(rss) // 3]
    return {"rss_mb_first": rss[0], "rss_mb_third": third, "rss_mb_end": rss[-1],
            "growth_third_to_end": round(rss[-1] / third - 1, 3), "seconds": seconds,
            "load_before": load_before, "load_after": load_avg(), "rss_mb": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llm-memory-") as tmp:
        result = {name: measure(name, args.model, args.rounds, args.seed, Path(tmp)) for name in args.variants}
    emit({"benchmark": "llm_server_memory", "model": args.model, "rounds": args.rounds,
          "load_avg_end": load_avg(), "variants": result}, args.out)


if __name__ == "__main__":
    main()
