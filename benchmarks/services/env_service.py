"""Benchmark of the environment service: HTTP overhead per step and many live `flights` instances.

    python benchmarks/services/env_service.py [--levels 1,64,1000] [--steps 2000]

Starts `python -m env_service` (inline backend, flights only) on a free 127.0.0.1 port, measures
step latency over HTTP with a keep-alive client against calling the environment in-process, then
for each concurrency level creates that many live instances, steps each of them, and samples the
server's RSS and PSS (children included). Prints one JSON line.

The client is aiohttp with a keep-alive connection pool: httpx's async pool costs several times
more CPU per request than the server does, which on 2 shared cores would measure the client.
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

import aiohttp
import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO  # noqa: E402
from common.schemas import ChatMessage  # noqa: E402
from env_service.environments.flights import FlightsEnvironment  # noqa: E402
from tests.helpers import free_port  # noqa: E402

ACTION = "get_passenger(passenger_id='P1001')"
MIB = 1024 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def in_process_latency(steps: int) -> dict[str, float]:
    env = FlightsEnvironment()
    instance = env.create("train-0000", {"max_steps": steps + 10})
    instance.reset()
    action = ChatMessage(role="assistant", content=ACTION)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        instance.step(action)
        times.append(time.perf_counter() - start)
    return {"p50_ms": percentile(times, 50) * 1e3, "p99_ms": percentile(times, 99) * 1e3}


def start_server(max_instances: int) -> tuple[subprocess.Popen, str]:
    conf = Path(tempfile.mkdtemp()) / "bench.yaml"
    conf.write_text(json.dumps({"env_service": {
        "environments": {"flights": {"max_steps": 100_000}}, "backend": "inline",
        "max_instances": max_instances, "log_level": "WARNING"}}))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--port", str(port), "--conf", str(conf)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("env_service did not become healthy")


def memory_mib(pid: int) -> dict[str, float]:
    root = psutil.Process(pid)
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return {"rss_mib": round(rss / MIB, 1), "pss_mib": round(pss / MIB, 1)}


async def call(client: aiohttp.ClientSession, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with client.request(method, path, json=body) as response:
        return response.status, await response.json()


async def http_latency(client: aiohttp.ClientSession, steps: int) -> dict[str, float]:
    _, created = await call(client, "POST", "/v1/instances", {"env": "flights", "task_id": "train-0000"})
    iid = created["instance_id"]
    body = {"action": {"role": "assistant", "content": ACTION}}
    for _ in range(50):  # warm up the connection and the code paths
        await call(client, "POST", f"/v1/instances/{iid}/step", body)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        status, answer = await call(client, "POST", f"/v1/instances/{iid}/step", body)
        times.append(time.perf_counter() - start)
        assert status == 200, answer
    await call(client, "DELETE", f"/v1/instances/{iid}")
    return {"p50_ms": percentile(times, 50) * 1e3, "p99_ms": percentile(times, 99) * 1e3}


async def level(client: aiohttp.ClientSession, pid: int, live: int, steps_each: int) -> dict[str, object]:
    errors = 0
    task_ids = [f"train-{i % 240:04d}" for i in range(live)]
    start = time.perf_counter()
    created = await asyncio.gather(*(call(client, "POST", "/v1/instances", {"env": "flights", "task_id": t})
                                     for t in task_ids))
    create_s = time.perf_counter() - start
    ids = []
    for status, answer in created:
        if status == 201:
            ids.append(answer["instance_id"])
        else:
            errors += 1
    body = {"action": {"role": "assistant", "content": ACTION}}
    latencies: list[float] = []

    async def run(iid: str) -> int:
        failed = 0
        for _ in range(steps_each):
            t0 = time.perf_counter()
            status, _ = await call(client, "POST", f"/v1/instances/{iid}/step", body)
            latencies.append(time.perf_counter() - t0)
            failed += status != 200
        return failed

    start = time.perf_counter()
    errors += sum(await asyncio.gather(*(run(i) for i in ids)))
    elapsed = time.perf_counter() - start
    stats = (await call(client, "GET", "/v1/instances"))[1]["stats"]
    memory = memory_mib(pid)  # sampled while every instance is live
    released = await asyncio.gather(*(call(client, "DELETE", f"/v1/instances/{i}") for i in ids))
    errors += sum(status != 200 or not answer["released"] for status, answer in released)
    return {"live": live, "live_at_sample": stats["live"], "created_in_s": round(create_s, 3),
            "steps": len(latencies), "steps_per_s": round(len(latencies) / elapsed, 1),
            "step_p50_ms": round(percentile(latencies, 50) * 1e3, 3),
            "step_p99_ms": round(percentile(latencies, 99) * 1e3, 3), "errors": errors, **memory}


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    levels = [int(x) for x in args.levels.split(",")]
    proc, url = start_server(max(levels) + 16)
    try:
        connector = aiohttp.TCPConnector(limit=args.connections)
        async with aiohttp.ClientSession(url, connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=300)) as client:
            idle = memory_mib(proc.pid)
            over_http = await http_latency(client, args.steps)
            local = in_process_latency(args.steps)
            results = []
            for live in levels:
                steps_each = max(5, min(500, 10_000 // live))
                results.append(await level(client, proc.pid, live, steps_each))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    return {
        "benchmark": "env_service", "backend": "inline", "cpus": os.cpu_count(), "client": "aiohttp keep-alive",
        "client_connections": args.connections,
        "step_http_p50_ms": round(over_http["p50_ms"], 3), "step_http_p99_ms": round(over_http["p99_ms"], 3),
        "step_in_process_p50_ms": round(local["p50_ms"], 4), "step_in_process_p99_ms": round(local["p99_ms"], 4),
        "http_overhead_p50_ms": round(over_http["p50_ms"] - local["p50_ms"], 3),
        "idle_server": idle, "levels": results,
        "per_instance_pss_kib": round((results[-1]["pss_mib"] - idle["pss_mib"]) * 1024 / max(1, levels[-1]), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,64,1000")
    parser.add_argument("--steps", type=int, default=2000, help="sequential steps for the latency numbers")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections of the client")
    print(json.dumps(asyncio.run(main_async(parser.parse_args()))))


if __name__ == "__main__":
    main()
