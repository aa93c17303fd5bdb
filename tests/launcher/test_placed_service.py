"""Services placed on another Ray node (`launcher.placement`), over a real two-node cluster on this machine.

The task manager and llm_server run as Ray actors on the node labelled `evolver/role=services` (127.0.0.3; the head
is 127.0.0.2, loopback addresses standing for two hosts), bind and advertise that node's address and keep their
folders on that node. The task manager serves the run's batches; llm_server serves the policy and gets each new
version as the body of an upload. Both actors' processes are SIGKILLed mid-run: Ray restarts each on the same node
and port, the trainer gives the restarted llm_server its weights again, and the run finishes every step with every
rollout generated on the latest weights.
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
import yaml

from tests.helpers import REPO
from tests.launcher.test_two_nodes import HEAD_HOST, records

pytestmark = pytest.mark.slow

STEPS = 10  # enough steps after the kills that the run is still going when Ray brings the actors back
SERVICES_HOST = "127.0.0.3"


def placed_line(service: str) -> re.Pattern[str]:
    return re.compile(rf"{service} placed by Ray on node (\w+) \(([\d.]+)\), actor pid (\d+)")


@pytest.fixture(scope="module")
def cluster():
    """The head (127.0.0.2, the trainer's node) and a node labelled for services (127.0.0.3)."""
    ray_cluster_utils = pytest.importorskip("ray.cluster_utils")
    temp_dir = tempfile.mkdtemp(prefix="evolver-pl-", dir="/tmp")  # short: Ray's socket paths
    built = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": HEAD_HOST, "include_dashboard": False, "temp_dir": temp_dir,
        "labels": {"evolver/role": "head"}})
    try:
        built.add_node(num_cpus=2, node_ip_address=SERVICES_HOST, labels={"evolver/role": "services"})
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
  services: [llm_server, env_service, task_manager]
  ports: {{llm_server: auto, env_service: auto, task_manager: auto}}
  hosts: {{env_service: {HEAD_HOST}}}
  placement:
    task_manager: {{node_labels: {{evolver/role: services}}, num_cpus: 1, max_restarts: 2, store_root: {node_folder}}}
    llm_server: {{node_labels: {{evolver/role: services}}, num_cpus: 1, max_restarts: 2, store_root: {node_folder}}}
  threads: {{default: 1, trainer: 1}}
  health_timeout_s: 90
  ray: {{address: "{address}"}}
llm_server: {{model: tiny, max_batch: 8}}
env_service:
  environments: {{signal: {{fallback: first_char}}}}
task_manager: {{environments: [signal], dedup: {{embeddings: false}}}}
trainer:
  model: tiny
  steps: {STEPS}
  tasks_per_step: 2
  progress: false
  plot: false
  policy: {{kind: endpoint, url: llm_server}}
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


def served_stats(policy_url: str, run_dir: Path) -> dict:
    """llm_server's /v1/stats, with the token the launcher generated for the run (a placed service requires one)."""
    token = (run_dir / "api_token").read_text().strip()
    return httpx.get(f"{policy_url}/v1/stats", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()


def test_placed_services_run_on_their_node_and_ray_restarts_them_mid_run(tmp_path, cluster):
    services_node = next(node for node in cluster.list_all_nodes() if node is not cluster.head_node)
    node_folder = tmp_path / "services-node"
    launcher, log = start(run_yaml(tmp_path, cluster.address, node_folder))
    try:
        run_dir = tmp_path / "runs" / "placed"
        first_pids = {}
        for service in ("task_manager", "llm_server"):
            placed = wait_until(lambda s=service: placed_line(s).search(log.read_text()), launcher, log,
                                f"{service}'s placement")
            node_prefix, node_ip, first_pids[service] = placed.group(1), placed.group(2), int(placed.group(3))
            assert services_node.node_id.startswith(node_prefix) and node_ip == SERVICES_HOST, service
        wait_until(lambda: records(run_dir), launcher, log, "a first step's rollouts")
        # Their peers were given the node's address, never a placeholder or 127.0.0.1.
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        task_url, policy = config["trainer"]["services"]["task_url"], config["trainer"]["policy"]
        for url in (task_url, policy["url"]):
            assert url.startswith(f"http://{SERVICES_HOST}:"), url
        # The trainer's weights reach the placed server as uploads (a path would be refused: it shares no folder).
        assert policy["weights_transfer"] == "http"
        stats = wait_until(lambda: (found := served_stats(policy["url"], run_dir))["policy_version"] >= 2 and found,
                           launcher, log, "a second policy version on llm_server")
        assert stats["weight_uploads"] >= 2, stats
        # Killed right after a push: the restarted server has the base weights when the next step generates.
        for pid in first_pids.values():
            os.kill(pid, signal.SIGKILL)  # the actor's process; its server dies with it
        code = launcher.wait(timeout=240)
        text = log.read_text()
        assert code == 0, text[-4000:]
        for service in first_pids:
            assert f"{service}: Ray restarted its actor (restart 1)" in text, text[-4000:]
        summary = json.loads((run_dir / "trainer" / "summary.json").read_text())
        assert summary["steps"] == STEPS
        rollouts = records(run_dir)
        assert {r["step"] for r in rollouts} == set(range(1, STEPS + 1)), "every step has its rollouts"
        # Every turn of every rollout was generated by the previous step's upload, none by the base weights a
        # restarted llm_server comes back with: the trainer uploaded its weights again before generating on it.
        versions = sorted({(r["step"], v) for r in rollouts for v in r["policy_versions"]})
        assert versions == [(step, step - 1) for step in range(1, STEPS + 1)], (versions, summary["resilience"])
        manifest = json.loads((run_dir / "manifest.json").read_text())
        actors = {c["name"]: c["ray_actor"] for c in manifest["result"]["children"] if "ray_actor" in c}
        for service, actor in actors.items():
            assert actor["node_id"] == services_node.node_id and actor["actor_pid"] != first_pids[service]
            # Its folder and log sit on the node, not in the run folder.
            assert Path(actor["store"]) == node_folder / "placed" / service
        assert set(actors) == {"task_manager", "llm_server"}
        assert any((node_folder / "placed" / "task_manager" / "task_manager").iterdir())
        assert not list((node_folder / "placed" / "llm_server").glob("weights/*")), "no weights went by a path"
        # The restarted actors reopened their folders: only a new run moves an old one aside.
        assert sorted(p.name for p in (node_folder / "placed").iterdir()) == ["llm_server", "task_manager"]
        assert not (run_dir / "task_manager").exists()
        # The end of the run killed the actors, and with them the servers; the cluster is the test's and lives on.
        for url in (task_url, policy["url"]):
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"{url}/healthz", timeout=2)
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
    # llm_server, the first service started, is the first to find no node.
    assert "llm_server failed: Ray placed its actor on no node within 3s: no node has evolver/role=gpu" in text
    assert "everything it started is stopped" in text and "started trainer" not in text
