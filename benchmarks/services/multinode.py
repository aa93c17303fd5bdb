"""Benchmark: environment steps per second through env_service's Ray backend, workers on one node and on two.

    python benchmarks/services/multinode.py [--actors 4] [--episodes 16] [--steps 40]

For each layout a real Ray cluster on this machine (`ray.cluster_utils.Cluster`, loopback only: the head on
127.0.0.2, the second node on 127.0.0.3), then `python -m env_service` joined to it with the `ray` backend and
`placement: spread`, then `--episodes` concurrent `flights` episodes of `--steps` steps each over HTTP. Prints
one JSON line: steps/s per layout and on which nodes Ray put the actors.

Two raylets on one machine share its cores: what the two-node layout shows is that Ray spreads the workers over
the nodes (the actor counts per node), not a speed-up, which takes nodes with cores of their own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

ACTION = {"role": "assistant", "content": "get_passenger(passenger_id='P1001')"}
HEAD, OTHER = "127.0.0.2", "127.0.0.3"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_env_service(address: str, actors: int) -> tuple[subprocess.Popen, str]:
    conf = Path(tempfile.mkdtemp()) / "bench.yaml"
    conf.write_text(json.dumps({"env_service": {
        "environments": {"flights": {"max_steps": 100_000}}, "backend": "ray", "log_level": "WARNING",
        "ray": {"address": address, "actors": actors, "placement": "spread"}}}))
    port = free_port(HEAD)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--host", HEAD, "--port", str(port),
                             "--conf", str(conf)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{HEAD}:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"env_service exited with {proc.returncode}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("env_service did not become healthy in 180 s")


async def episodes(url: str, count: int, steps: int) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:
        async def one(i: int) -> set[str]:
            created = (await client.post("/v1/instances", json={"env": "flights", "task_id": f"train-{i % 40:04d}"}))
            created.raise_for_status()
            iid = created.json()["instance_id"]
            for _ in range(steps):
                (await client.post(f"/v1/instances/{iid}/step", json={"action": ACTION})).raise_for_status()
            await client.delete(f"/v1/instances/{iid}")
            return {created.json()["host"]["node_id"]}

        started = time.perf_counter()
        nodes = await asyncio.gather(*(one(i) for i in range(count)))
        seconds = time.perf_counter() - started
        stats = (await client.get("/v1/instances")).json()["stats"]
    return {"env_steps": count * steps, "seconds": round(seconds, 3),
            "env_steps_per_s": round(count * steps / seconds, 1),
            "actors_per_node": dict(Counter(n[:8] for n in stats["actor_nodes"] if n)),
            "episodes_per_node": dict(Counter(next(iter(n))[:8] for n in nodes))}


def measure(nodes: int, args: argparse.Namespace) -> dict:
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="evolver-bmn-", dir="/tmp")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": HEAD, "include_dashboard": False, "temp_dir": temp_dir})
    proc = None
    try:
        if nodes == 2:
            cluster.add_node(num_cpus=1, node_ip_address=OTHER)
        proc, url = start_env_service(cluster.address, args.actors)
        return {"nodes": nodes, **asyncio.run(episodes(url, args.episodes, args.steps))}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=16, help="concurrent episodes")
    parser.add_argument("--steps", type=int, default=40, help="steps per episode")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    layouts = [measure(1, args), measure(2, args)]
    print(json.dumps({
        "benchmark": "multinode_env_steps", "actors": args.actors, "episodes": args.episodes, "steps": args.steps,
        "cores": os.cpu_count(), "layouts": layouts,
        "note": ("both nodes are raylets on this one machine and share its cores: the two-node layout shows Ray "
                 "spreading the workers over the nodes, not a speed-up")}))


if __name__ == "__main__":
    main()
