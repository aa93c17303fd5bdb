"""docs/multi-node.md, run as a reader would on two nodes, here two raylets on loopback addresses: 127.0.0.2 is
the head, 127.0.0.3 a worker. Every `bash` block runs in order in one bash script (variables carry over); a
`console` block is shown, not run (`ray stop` would stop every Ray on this shared machine: the test stops what
the page started, found by a marker in its processes' environment).

Two raylets on one machine also need ports of their own where Ray's defaults are fixed (the dashboard and its
agent, the client server) and a session folder each: the test adds those flags to each `ray start`, nothing else.
The run itself (workers on the other node, that node lost mid-run) is tests/launcher/test_two_nodes.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import uuid

import pytest
import yaml

from common.config import compose
from evolver_launcher.leftovers import MARKER, marked_processes, stop_ray_processes
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow

PAGE = REPO / "docs" / "multi-node.md"
BLOCK = re.compile(r"```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


def blocks(lang: str) -> list[str]:
    return [b["body"] for b in BLOCK.finditer(PAGE.read_text()) if b["lang"] == lang]


def one_machine_flags(command: str, temp_root: str) -> str:
    """`ray start` with the ports and session folder a second raylet on this machine needs."""
    def flags(match: re.Match) -> str:
        extra = (f" --dashboard-agent-listen-port={free_port()} --temp-dir={temp_root}/{uuid.uuid4().hex[:6]}"
                 f" --metrics-export-port={free_port()} --object-store-memory={150 * 1024 * 1024}")
        if "--head" in command[match.end():].split("\n", 1)[0]:
            extra += f" --ray-client-server-port={free_port()} --dashboard-port={free_port()}"
        return match.group(0) + extra
    return re.sub(r"ray start", flags, command)


def differences(shown: object, actual: object, path: str = "") -> list[str]:
    """Key paths where `shown` (a part of a config) disagrees with `actual`."""
    if isinstance(shown, dict) and isinstance(actual, dict):
        return [d for k, v in shown.items() for d in differences(v, actual.get(k), f"{path}.{k}".lstrip("."))]
    return [] if shown == actual else [path]


def test_the_pages_yaml_is_what_the_example_runs():
    (shown,) = blocks("yaml")
    assert differences(yaml.safe_load(shown), compose(REPO / "examples" / "multinode.yaml")) == []
    assert differences({"a": {"b": 1}}, {"a": {"b": 2, "c": 3}}) == ["a.b"]


def test_the_recipe_joins_a_worker_node_and_plans_the_run_on_its_addresses(tmp_path):
    temp_root = tempfile.mkdtemp(prefix="evolver-mn-", dir="/tmp")  # short: Ray's socket paths
    script = "set -euo pipefail\n" + "\n".join(one_machine_flags(b, temp_root) for b in blocks("bash"))
    marker = f"multinode-doc-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "EVOLVER": str(REPO), "HEAD_IP": HEAD_IP, "WORKER_IP": WORKER_IP,
           "RAY_PORT": str(free_port()), MARKER: marker}
    for name in ("RAY_ADDRESS", "PYTHONPATH", "EVOLVER_API_TOKEN"):
        env.pop(name, None)
    env["PYTHONPATH"] = str(REPO)  # the launcher imports this checkout, as from its folder
    try:
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-4000:]
        # `ray status` lists both nodes (it reports a node that just joined a moment later: ask again).
        status = out[out.index("Node status"):]
        for _ in range(20):
            if len(re.findall(r"^\s*1 node_[0-9a-f]+", status, re.M)) == 2:
                break
            status = subprocess.run([str(REPO / ".venv" / "bin" / "ray"), "status", f"--address={HEAD_IP}:"
                                     f"{env['RAY_PORT']}"], env=env, capture_output=True, text=True, timeout=60).stdout
        assert len(re.findall(r"^\s*1 node_[0-9a-f]+", status, re.M)) == 2, status[:2000]
    finally:
        stop_ray_processes(marked_processes(marker), grace_s=3)  # in Ray's order, as `ray stop` does
    # The plan joins the cluster and hands every peer the head's address.
    assert f"ray: join {HEAD_IP}:{env['RAY_PORT']}" in out
    assert re.search(rf"env_service: port \d+, .*ready: GET http://{re.escape(HEAD_IP)}:\d+/healthz", out)
    assert "--host 127.0.0.1" not in out and "dry run: nothing was started" in out
