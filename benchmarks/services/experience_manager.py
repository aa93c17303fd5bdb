"""Benchmark of the experience manager; prints one JSON line.

Retrieve latency over HTTP (p50/p95, cold = new query text so the embedding is computed, and cache
hit) with pools of 1k, 10k and 50k experiences, summarize throughput, and the fixture's retrieval
quality. Pools are seeded straight into the Qdrant store with precomputed vectors (embedding 50k
texts would take minutes and measures nothing about retrieval), then served by the real service.

    .venv/bin/python benchmarks/services/experience_manager.py [--tiers 1000,10000,50000] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.embeddings import shared_embedder  # noqa: E402
from common.schemas import Experience, Provenance  # noqa: E402
from experience_manager import quality  # noqa: E402
from experience_manager.store import QdrantStore, encode_vector  # noqa: E402
from experience_manager.text import content_hash  # noqa: E402
from tests.helpers import run_service  # noqa: E402

VERBS = ["book", "cancel", "find", "delete", "send", "schedule", "transfer", "order", "translate", "convert",
         "reserve", "check", "update", "list", "move", "compare", "summarise", "download", "rename", "share"]
OBJECTS = ["a flight", "the hotel room", "an email", "the meeting", "money", "a product", "the weather",
           "a file", "the calendar event", "a table", "the stock price", "the password", "a playlist",
           "the invoice", "a parcel", "the report", "a ticket", "the subscription", "a recipe", "the photos"]
PLACES = ["in Paris", "for tomorrow", "from my account", "to Alice", "in the shared folder", "next Friday",
          "for two people", "under 100 dollars", "in Spanish", "on the server", "this weekend", "for the team"]


def task_text(rng: random.Random) -> str:
    return f"{rng.choice(VERBS).capitalize()} {rng.choice(OBJECTS)} {rng.choice(PLACES)} (#{rng.randrange(10**6)})"


def seed_store(root: Path, size: int, base_texts: list[str], base_vectors: np.ndarray, rng: random.Random) -> float:
    """Write `size` experiences with vectors near the base set into the store folder; returns seconds."""
    start = time.perf_counter()
    noise = np.random.default_rng(size)
    store = QdrantStore(path=root / "qdrant", url=None, api_key=None, dimension=base_vectors.shape[1],
                        batch_size=512)
    store.ensure("bench")
    # Seeding only: skip sqlite's per-point fsync (local mode commits every point), which would make a
    # 50k pool take many minutes on a busy disk. The service itself always runs with full durability.
    store.client._client.collections["exp__bench"].storage.storage.execute("PRAGMA synchronous=OFF")
    writes = []
    for i in range(size):
        k = i % len(base_texts)
        vector = base_vectors[k] + 0.35 * noise.standard_normal(base_vectors.shape[1]).astype(np.float32) / 20
        vector /= np.linalg.norm(vector)
        when = f"{base_texts[k]} [{i}]"
        content = f"Case {i}: call the search tool first, then act on the returned id; verify before finishing."
        experience = Experience(experience_id=f"exp_b{i:07d}", workspace_id="bench", when_to_use=when,
                                content=content, content_hash=content_hash(when, content),
                                provenance=Provenance(task_ids=[f"t{i}"]), embedding_model="all-MiniLM-L6-v2@384")
        writes.append({"upsert": experience.model_dump(mode="json"), "vector": encode_vector(vector)})
        if len(writes) == 2048:
            store.apply("bench", writes)
            writes = []
    store.apply("bench", writes)
    store.close()
    return time.perf_counter() - start


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2),
            "n": len(samples)}


def measure_retrieve(url: str, n_queries: int, rng: random.Random) -> dict:
    cold, hit = [], []
    with httpx.Client(base_url=url, timeout=60) as http:
        http.post("/v1/workspaces/bench/retrieve", json={"query": "warm up the connection"})
        for _ in range(n_queries):
            body = {"query": task_text(rng), "top_k": 3}
            start = time.perf_counter()
            reply = http.post("/v1/workspaces/bench/retrieve", json=body)
            cold.append(time.perf_counter() - start)
            assert reply.status_code == 200 and not reply.json()["cached"], reply.text
        body = {"query": task_text(rng), "top_k": 3}
        http.post("/v1/workspaces/bench/retrieve", json=body)
        for _ in range(2 * n_queries):
            start = time.perf_counter()
            reply = http.post("/v1/workspaces/bench/retrieve", json=body)
            hit.append(time.perf_counter() - start)
            assert reply.json()["cached"]
    return {"cold": percentiles(cold), "cache_hit": percentiles(hit)}


def measure_summarize(url: str, rng: random.Random, batches: int = 4, groups: int = 16) -> dict:
    from tests.experience_manager.conftest import chat_trajectory

    n_traj = n_exp = 0
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=300) as http:
        for b in range(batches):
            trajectories = []
            for g in range(groups):
                query = task_text(rng)
                calls = [(f"tool_{rng.randrange(30)}", {"a": 1, "b": 2}) for _ in range(3)]
                trajectories.append(chat_trajectory(f"s{b}_{g}", query, calls, 1.0))
                trajectories.append(chat_trajectory(f"s{b}_{g}", query, calls[:1], 0.0, error="Error: bad"))
            reply = http.post("/v1/workspaces/bench_sum/summarize", json={"trajectories": trajectories,
                                                                          "request_id": f"bench-{b}"}).json()
            n_traj += len(trajectories)
            n_exp += len(reply["created"]) + len(reply["updated"])
    seconds = time.perf_counter() - start
    return {"trajectories_per_s": round(n_traj / seconds, 1), "experiences_per_s": round(n_exp / seconds, 1),
            "trajectories": n_traj, "batch_size": 2 * groups, "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="1000,10000,50000")
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    rng = random.Random(0)
    embedder = shared_embedder()
    base_texts = [task_text(rng) for _ in range(512)]
    base_vectors = embedder.encode(base_texts)
    report: dict = {"benchmark": "experience_manager", "tiers": {}}
    for size in (int(s) for s in args.tiers.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"em_bench_{size}_") as tmp:
            root = Path(tmp)
            seed_seconds = seed_store(root, size, base_texts, base_vectors, rng)
            start = time.perf_counter()
            with run_service("experience_manager", ["--store", str(root)], timeout=900) as svc:
                startup = time.perf_counter() - start
                tier = {"seed_s": round(seed_seconds, 1), "service_start_s": round(startup, 1),
                        **measure_retrieve(svc.url, args.queries, rng)}
                if size == min(int(s) for s in args.tiers.split(",")):
                    report["summarize"] = measure_summarize(svc.url, rng)
            report["tiers"][str(size)] = tier
    q = quality.run(embedder)
    report["retrieval_quality_test_half"] = {k: q["test"][k] for k in ("hybrid", "dense_only", "bm25")}
    report["calibrated"] = q["calibrated"]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
