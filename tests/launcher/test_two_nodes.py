"""A run over a real two-node Ray cluster on this machine (loopback only): the launcher joins it, the env
service's workers run on the non-head node, and the run finishes every step after that node is killed.

The cluster is `ray.cluster_utils.Cluster`: each node its own raylet with its own node id, as Ray's own tests
build one. The head node is 127.0.0.2 and the env node 127.0.0.3, standing in for two hosts (Ray would rewrite
127.0.0.1 into this machine's network address, which a test must not use); the env service binds 127.0.0.2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow

STEPS = 8
HEAD_HOST, ENV_NODE_HOST = "127.0.0.2", "127.0.0.3"


def run_yaml(tmp_path: Path, address: str) -> Path:
    path = tmp_path / "two-nodes.yaml"
    path.write_text(f"""
launcher:
  experiment: two-nodes
  runs_dir: {tmp_path / "runs"}
  services: [env_service]
  ports: {{env_service: auto}}
  hosts: {{env_service: {HEAD_HOST}}}
  threads: {{default: 1, trainer: 1}}
  health_timeout_s: 90
  ray: {{address: "{address}"}}
env_service:
  environments: {{signal: {{fallback: first_char}}}}
  backend: ray
  reap_interval_s: 0.5
  call_timeout_s: 20
  ray: {{actors: 2, node_labels: {{evolver/role: env}}, health_check_s: 2}}
trainer:
  model: tiny
  steps: {STEPS}
  tasks_per_step: 2
  progress: false
  plot: false
  rollout: {{env: signal, n: 2, max_turns: 2, max_new_tokens: 4, max_context: 256, retries: 3}}
  eval: {{before: false, after: false}}
  ray: {{node_labels: {{evolver/role: head}}}}
""")
    return path


def records(run_dir: Path) -> list[dict]:
    out = []
    for shard in sorted((run_dir / "trainer" / "rollouts").glob("shard-*.jsonl")):
        for line in shard.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # the trainer is writing this line right now
    return out


def step_once_workers_on(node_id: str, run_dir: Path, launcher: subprocess.Popen, deadline: float) -> int:
    """The last step with records once every env worker runs on `node_id`, as env_service reports: a killed node's
    worker can outlive its raylet a moment and finish an episode, so only the steps begun after this one are
    sure to have run on the new workers alone."""
    port = json.loads((run_dir / "manifest.json").read_text())["config"]["env_service"]["port"]
    nodes: list = []
    while time.monotonic() < deadline and launcher.poll() is None:
        try:
            nodes = httpx.get(f"http://{HEAD_HOST}:{port}/v1/instances", timeout=5).json()["stats"]["actor_nodes"]
        except httpx.HTTPError:
            nodes = []
        if nodes and set(nodes) == {node_id}:
            return max(r["step"] for r in records(run_dir))
        time.sleep(0.1)
    raise AssertionError(f"the env workers never all ran on {node_id} (last seen on {nodes})")


def test_env_workers_run_on_the_other_node_and_the_run_survives_its_loss(tmp_path):
    ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
    temp_dir = tempfile.mkdtemp(prefix="evolver-2n-", dir="/tmp")  # short: Ray's socket paths
    cluster = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": HEAD_HOST, "include_dashboard": False, "temp_dir": temp_dir,
        "labels": {"evolver/role": "head"},
        # A killed node is declared dead after ~1 s instead of Ray's default 15 s.
        "_system_config": {"health_check_period_ms": 300, "health_check_failure_threshold": 3,
                           "health_check_timeout_ms": 300}})
    launcher = None
    try:
        # The trainer's actor asks for the head's label: it never lands on the node this test kills.
        env_node = cluster.add_node(num_cpus=1, node_ip_address=ENV_NODE_HOST, labels={"evolver/role": "env"})
        head_id, env_node_id = cluster.head_node.node_id, env_node.node_id
        conf = run_yaml(tmp_path, cluster.address)
        log = tmp_path / "launcher.out"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}
        env.pop("RAY_ADDRESS", None)
        with log.open("wb") as out:
            launcher = subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, env=env,
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        run_dir = tmp_path / "runs" / "two-nodes"
        deadline = time.monotonic() + 240
        before: list[dict] = []
        while time.monotonic() < deadline and launcher.poll() is None:
            before = records(run_dir)
            if before:
                break
            time.sleep(0.2)
        assert before, f"no rollout records before the deadline:\n{log.read_text()[-4000:]}"
        # Episodes ran on the env node: the records name it.
        assert {r["env_host"]["node_id"] for r in before} == {env_node_id}, [r["env_host"] for r in before]
        assert all(r["env_host"]["node_ip"] == ENV_NODE_HOST for r in before)
        cluster.remove_node(env_node, allow_graceful=False)  # mid-run: the trainer is at its first steps
        moved = step_once_workers_on(head_id, run_dir, launcher, time.monotonic() + 120)
        code = launcher.wait(timeout=240)
        text = log.read_text()
        assert code == 0, text[-4000:]
        assert cluster.head_node.remaining_processes_alive(), "the launcher stops only what it started"
        summary = json.loads((run_dir / "trainer" / "summary.json").read_text())
        assert summary["steps"] == STEPS
        after = [r for r in records(run_dir) if r["step"] > moved + 1]
        assert after and {r["env_host"]["node_id"] for r in after} == {head_id}, "the workers came back on the head"
        resilience = summary["resilience"]
        # Every episode lost with the node was collected again (none is lost when the kill falls between two
        # steps' env calls and the health check replaces the workers first: a slow update on a loaded machine).
        assert resilience["rollouts_collected_again"] == resilience["rollouts_lost_with_env_worker"], resilience
        assert {r["step"] for r in records(run_dir)} == set(range(1, STEPS + 1)), "every step has its rollouts"
    finally:
        if launcher is not None and launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        cluster.shutdown()
