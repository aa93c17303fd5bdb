"""A service placed on another Ray node (`launcher.placement`), over a real two-node cluster on this machine.

The task manager runs as a Ray actor on the node labelled `evolver/role=services` (127.0.0.3; the head is
127.0.0.2, loopback addresses standing for two hosts), binds and advertises that node's address, keeps its store
on that node's folder, and serves the run's batches. Its actor's process is SIGKILLed mid-run: Ray restarts it on
the same node and port, and the run finishes every step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO
from tests.launcher.test_two_nodes import HEAD_HOST, records

pytestmark = pytest.mark.slow

STEPS = 10  # enough steps after the kill that the run is still going when Ray brings the actor back
SERVICES_HOST = "127.0.0.3"
PLACED = re.compile(r"task_manager placed by Ray on node (\w+) \(([\d.]+)\), actor pid (\d+)")


@pytest.fixture(scope="module")
def cluster():
    """The head (127.0.0.2, the trainer's node) and a node labelled for services (127.0.0.3)."""
    ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
    temp_dir = tempfile.mkdtemp(prefix="evolver-pl-", dir="/tmp")  # short: Ray's socket paths
    built = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": HEAD_HOST, "include_dashboard": False, "temp_dir": temp_dir,
        "labels": {"evolver/role": "head"}})
    try:
        built.add_node(num_cpus=1, node_ip_address=SERVICES_HOST, labels={"evolver/role": "services"})
        yield built
    finally:
        built.shutdown()


def start(conf: Path) -> tuple[subprocess.Popen, Path]:
    log = conf.parent / "launcher.out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    env.pop("EVOLVER_API_TOKEN", None)
    with log.open("wb") as out:
        launcher = subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return launcher, log


def run_yaml(tmp_path: Path, address: str, node_folder: Path) -> Path:
    path = tmp_path / "placed.yaml"
    path.write_text(f"""
launcher:
  experiment: placed
  runs_dir: {tmp_path / "runs"}
  services: [env_service, task_manager]
  ports: {{env_service: auto, task_manager: auto}}
  hosts: {{env_service: {HEAD_HOST}}}
  placement:
    task_manager: {{node_labels: {{evolver/role: services}}, num_cpus: 1, max_restarts: 2, store_root: {node_folder}}}
  threads: {{default: 1, trainer: 1}}
  health_timeout_s: 90
  ray: {{address: "{address}"}}
env_service:
  environments: {{signal: {{fallback: first_char}}}}
task_manager: {{environments: [signal], dedup: {{embeddings: false}}}}
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


def wait_until(check, launcher: subprocess.Popen, log: Path, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} never happened:\n{log.read_text()[-4000:]}")


def test_a_placed_service_runs_on_its_node_and_ray_restarts_it_mid_run(tmp_path, cluster):
    services_node = next(node for node in cluster.list_all_nodes() if node is not cluster.head_node)
    node_folder = tmp_path / "services-node"
    launcher, log = start(run_yaml(tmp_path, cluster.address, node_folder))
    try:
        run_dir = tmp_path / "runs" / "placed"
        placed = wait_until(lambda: PLACED.search(log.read_text()), launcher, log, "the task manager's placement")
        node_prefix, node_ip, first_pid = placed.group(1), placed.group(2), int(placed.group(3))
        assert services_node.node_id.startswith(node_prefix) and node_ip == SERVICES_HOST
        # Its peers were given the node's address, never a placeholder or 127.0.0.1.
        config = (run_dir / "config.yaml").read_text()
        task_url = re.search(r"task_url: (\S+)", config).group(1)
        assert task_url.startswith(f"http://{SERVICES_HOST}:"), task_url
        wait_until(lambda: records(run_dir), launcher, log, "a first step's rollouts")
        os.kill(first_pid, signal.SIGKILL)  # the actor's process; its server dies with it
        code = launcher.wait(timeout=240)
        text = log.read_text()
        assert code == 0, text[-4000:]
        assert "task_manager: Ray restarted its actor (restart 1)" in text, text[-4000:]
        summary = json.loads((run_dir / "trainer" / "summary.json").read_text())
        assert summary["steps"] == STEPS
        assert {r["step"] for r in records(run_dir)} == set(range(1, STEPS + 1)), "every step has its rollouts"
        manifest = json.loads((run_dir / "manifest.json").read_text())
        actor = next(c for c in manifest["result"]["children"] if c["name"] == "task_manager")["ray_actor"]
        assert actor["node_id"] == services_node.node_id and actor["actor_pid"] != first_pid
        # Its store and log sit in the node's folder, not in the run folder.
        assert Path(actor["store"]) == node_folder / "placed" / "task_manager"
        assert any((node_folder / "placed" / "task_manager" / "task_manager").iterdir())
        # The restarted actor reopened that store: only a new run moves an old one aside.
        assert [p.name for p in (node_folder / "placed").iterdir()] == ["task_manager"]
        assert not (run_dir / "task_manager").exists()
        # The end of the run killed the actor, and with it the server; the cluster is the test's and lives on.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{task_url}/healthz", timeout=2)
        assert cluster.head_node.remaining_processes_alive(), "the launcher stops only what it started"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)


def test_a_service_placed_on_no_node_stops_the_run_naming_the_labels(tmp_path, cluster):
    conf = run_yaml(tmp_path, cluster.address, tmp_path / "nowhere")
    conf.write_text(conf.read_text().replace("evolver/role: services", "evolver/role: gpu")
                    .replace("health_timeout_s: 90", "health_timeout_s: 3"))
    launcher, log = start(conf)
    try:
        assert launcher.wait(timeout=120) == 1
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    text = log.read_text()
    assert "task_manager failed: Ray placed its actor on no node within 3s: no node has evolver/role=gpu" in text
    assert "everything it started is stopped" in text and "started trainer" not in text
