"""A worker joins the launcher's own Ray head with the very command the plan prints (its placeholders filled in),
and `ray status` lists both nodes. Loopback only: the head listens on 127.0.0.2, the worker is 127.0.0.3; the
worker gets the flags a second raylet on one machine needs (tests/docs/test_multi_node.py: `one_machine_flags`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import uuid

import pytest

from evolver_launcher.leftovers import MARKER, marked_processes, stop_ray_processes
from tests.docs.test_multi_node import one_machine_flags
from tests.helpers import REPO, killed_at_exit
from tests.launcher.test_lifecycle import start_launcher, wait_for, write_config

pytestmark = pytest.mark.slow

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
CONFIG = f"""
launcher:
  experiment: join
  runs_dir: RUNS_DIR
  services: []
  trainer: false
  ray: {{dashboard: false, num_cpus: 1, node_address: {HEAD}, labels: {{evolver/role: head}}}}
"""
NODE = re.compile(r"^\s*1 node_[0-9a-f]+", re.M)


def test_a_worker_joins_the_launchers_head_with_the_printed_command(tmp_path):
    launcher, log = start_launcher(write_config(tmp_path, CONFIG))
    marker = f"join-head-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}", MARKER: marker}
    env.pop("RAY_ADDRESS", None)
    with killed_at_exit(launcher):
        text = wait_for(log, r"Ctrl-C stops them", launcher, timeout=120)
        printed = re.search(r"other nodes join with: (.+)", text).group(1)
        address = re.search(r"--address=(\S+)", printed).group(1)
        assert address.startswith(f"{HEAD}:")
        command = printed.replace("<this node's address>", WORKER).replace("<cores>", "1")
        temp_root = tempfile.mkdtemp(prefix="evolver-jh-", dir="/tmp")  # short: Ray's socket paths
        try:
            joined = subprocess.run(["bash", "-c", one_machine_flags(command, temp_root)], env=env,
                                    capture_output=True, text=True, timeout=120)
            assert joined.returncode == 0, (joined.stdout + joined.stderr)[-3000:]
            status = ""
            for _ in range(20):  # a node that just joined is listed a moment later
                status = subprocess.run(["ray", "status", f"--address={address}"], env=env, capture_output=True,
                                        text=True, timeout=60).stdout
                if len(NODE.findall(status)) == 2:
                    break
            assert len(NODE.findall(status)) == 2, status[:2000]
        finally:
            stop_ray_processes(marked_processes(marker), grace_s=3)  # the worker, in Ray's order
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 128 + signal.SIGINT
    assert "everything it started is stopped" in log.read_text()
