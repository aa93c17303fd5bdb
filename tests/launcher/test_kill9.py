"""`kill -9` of the launcher itself mid-run: the next run stops the leftovers, runs cleanly, leaves nothing.

Nothing but the launcher dies: its children get SIGTERM from the kernel (PR_SET_PDEATHSIG), but
what they started (Ray's gcs_server, raylet, workers) may live on. Processes are found by the launch
marker in their environment, the same way the launcher finds them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from evolver_launcher.leftovers import marked_processes
from tests.helpers import killed_at_exit
from tests.launcher.test_lifecycle import start_launcher, wait_for, write_config

pytestmark = pytest.mark.slow

CONFIG = """
launcher:
  experiment: k9
  runs_dir: RUNS_DIR
  services: [env_service]
  ports: {env_service: auto}
  threads: {default: 1, trainer: 1}
  ray: {dashboard: false, num_cpus: 2}
env_service: {environments: {signal: {fallback: first_char}}}
trainer:
  model: tiny
  steps: 1
  tasks_per_step: 2
  progress: false
  rollout: {env: signal, n: 2, max_turns: 2, max_new_tokens: 4, max_context: 256}
  eval: {before: false, after: false, tasks: 4}
"""
DEFAULT_ADDRESS_FILE = Path("/tmp/ray/ray_current_cluster")


def _address_file_content() -> str | None:
    try:
        return DEFAULT_ADDRESS_FILE.read_text()
    except OSError:
        return None


def _head_start(log: Path) -> tuple[str, Path]:
    """The GCS address (ip:port) and the --temp-dir of the Ray head a launcher's log shows it starting."""
    argv = next(line for line in log.read_text().splitlines() if "--temp-dir" in line).split()
    flag = {name: argv[argv.index(name) + 1] for name in ("--node-ip-address", "--port", "--temp-dir")}
    return f"{flag['--node-ip-address']}:{flag['--port']}", Path(flag["--temp-dir"])


def test_kill_9_of_the_launcher_then_the_next_run_starts_cleanly_and_leaves_nothing(tmp_path):
    conf = write_config(tmp_path, CONFIG)
    registry = tmp_path / "runs" / ".k9.launch.json"

    first, first_log = start_launcher(conf)
    with killed_at_exit(first):
        wait_for(first_log, r"trainer running in Ray actor", first, timeout=300)
        first_id = json.loads(registry.read_text())["launch_id"]
        first_gcs, first_temp_dir = _head_start(first_log)
        ray_address_file = first_temp_dir / "ray_current_cluster"
        assert first.poll() is None, "the run must still be going when its launcher is killed"
        running = marked_processes(first_id)
        assert len(running) >= 4  # ray head, gcs_server, raylet, env_service, trainer, ...
        os.kill(first.pid, signal.SIGKILL)  # the launcher alone, not its group
        first.wait(timeout=10)
    # The kernel's PDEATHSIG reaches the children; what they started may still be shutting down (or
    # stuck) when the next run starts: that one stops whatever still carries the first run's marker.

    second_conf = tmp_path / "second"
    second_conf.mkdir()
    second, second_log = start_launcher(write_config(second_conf, CONFIG.replace("RUNS_DIR", str(tmp_path / "runs"))))
    second_id = None
    with killed_at_exit(second):
        deadline = time.monotonic() + 600
        while second.poll() is None and time.monotonic() < deadline:
            if second_id is None and registry.exists():  # the first run's, until the second replaces it
                current = json.loads(registry.read_text())["launch_id"]
                second_id = current if current != first_id else None
            time.sleep(0.2)
        code = second.wait(timeout=5)
    out = second_log.read_text()
    assert code == 0, out[-4000:]
    assert "finished" in out
    time.sleep(0.5)
    assert marked_processes(first_id) == []
    assert second_id not in (None, first_id) and marked_processes(second_id) == []
    assert not registry.exists()
    assert not ray_address_file.exists()  # its head's address file is gone with it
    # The second run's own processes are all gone, and neither run's head is named in the machine-wide address
    # file (other tests running beside this one may start Ray clusters that write it).
    assert not any(".launch.json" in p.name for p in (tmp_path / "runs").iterdir())
    machine_wide = _address_file_content() or ""
    for gcs in (first_gcs, _head_start(second_log)[0]):
        assert gcs not in machine_wide, (gcs, machine_wide)


def test_a_dead_launchers_registry_gets_its_marked_processes_stopped(tmp_path):
    """The reaping path alone, deterministically: a marked process that outlived its (dead) launcher."""
    import subprocess
    import sys

    from evolver_launcher.leftovers import MARKER, new_launch_id, reap_abandoned, write_registry

    runs = tmp_path / "runs"
    launch_id = new_launch_id()
    stale = tmp_path / "ray_current_cluster"
    stale.write_text("127.0.0.1:1")
    write_registry(runs / "old", launch_id, [stale])
    # A process that ignores SIGTERM, as gcs_server does while clients are connected.
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(300)"],
                                env={**os.environ, MARKER: launch_id}, stdout=subprocess.PIPE)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        assert stubborn.stdout.readline() == b"ready\n"
        assert marked_processes(launch_id) == [stubborn.pid]
        said: list[str] = []
        assert reap_abandoned(runs, None, said.append) == 1
        assert stubborn.wait(timeout=10) == -signal.SIGKILL
        assert "died without stopping its children" in said[0]
        assert not stale.exists() and not (runs / ".old.launch.json").exists()
        assert bystander.poll() is None  # unmarked: never touched
    finally:
        for proc in (stubborn, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
