"""The launcher as a user runs it: real services, a real Ray head and the trainer, then Ctrl-C; a crashing service.

After each run, nothing the launcher started may be left: no process (the launcher's whole process
tree, Ray's included, is recorded while it runs) and no bound port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from evolver_launcher.plan import port_is_free
from tests.helpers import REPO

pytestmark = pytest.mark.slow


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("RUNS_DIR", str(tmp_path / "runs")))
    return path


def start_launcher(conf: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    log = conf.parent / "launcher.out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "launcher.py", "--conf", str(conf), *extra], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def wait_for(log: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if re.search(pattern, text):
            return text
        if proc.poll() is not None:
            pytest.fail(f"launcher exited with {proc.returncode} before {pattern!r}:\n{text[-4000:]}")
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"no {pattern!r} within {timeout}s:\n{log.read_text(errors='replace')[-4000:]}")


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def still_running(processes: list[psutil.Process]) -> list[str]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return alive


def listening(ports: list[int]) -> list[int]:
    wanted = set(ports)
    return sorted({c.laddr.port for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr.port in wanted})


def planned_ports(run_dir: Path) -> list[int]:
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    ports = [data[s]["port"] for s in data["launcher"]["services"]]
    ray = ((data.get("trainer") or {}).get("ray") or {}).get("address")
    if ray:
        ports.append(int(ray.rsplit(":", 1)[1]))
    return ports


def test_sigint_after_all_services_are_healthy_leaves_nothing(tmp_path):
    conf = write_config(tmp_path, """
launcher:
  experiment: sigint
  runs_dir: RUNS_DIR
  services: [llm_server, env_service, task_manager, experience_manager, judge]
  ports: {llm_server: auto, env_service: auto, task_manager: auto, experience_manager: auto, judge: auto}
  threads: {default: 1, llm_server: 1, trainer: 1}
  ray: {dashboard_port: auto, num_cpus: 2}
llm_server: {model: tiny}
env_service: {environments: {signal: {fallback: first_char}}}
task_manager: {environments: [signal], dedup: {embeddings: false}}
experience_manager: {summary: {mode: heuristic}}
judge: {llm: {base_url: llm_server}}
trainer:
  model: tiny
  steps: 10000
  tasks_per_step: 2
  progress: false
  rollout: {env: signal, n: 2, max_turns: 2, max_new_tokens: 4, max_context: 256}
  eval: {before: false, after: false, tasks: 4}
""")
    proc, log = start_launcher(conf)
    try:
        wait_for(log, r"all services healthy", proc, timeout=240)
        text = wait_for(log, r"trainer running in Ray actor", proc, timeout=180)
        for name in ("llm_server", "env_service", "task_manager", "experience_manager", "judge", "ray"):
            assert re.search(rf"{name} is healthy", text), name
        time.sleep(2)  # the actor's worker process is up
        tree = process_tree(proc.pid)
        names = " ".join(" ".join(p.cmdline()) for p in tree if p.is_running())
        assert "raylet" in names and "-m trainer" in names and "-m llm_server" in names
        run_dir = tmp_path / "runs" / "sigint"
        ports = planned_ports(run_dir)
        assert not any(port_is_free("127.0.0.1", p) for p in ports), "every service holds its port"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert code == 128 + signal.SIGINT, out[-3000:]
    assert "got SIGINT: stopping everything this launcher started" in out
    time.sleep(0.5)
    assert still_running(tree) == [], out[-3000:]
    assert listening(ports) == [], "no port left bound"
    assert all(port_is_free("127.0.0.1", p) for p in ports)
    manifest = yaml.safe_load((run_dir / "manifest.json").read_text())
    assert manifest["result"]["exit_code"] == code
    assert manifest["judge_prompt"]["system_prompt_sha256"]
    assert manifest["environments"]["served"][0]["name"] == "signal"
    assert manifest["git"]["commit"]


def test_a_service_that_crashes_at_start_stops_the_run_with_its_log_tail(tmp_path):
    conf = write_config(tmp_path, """
launcher:
  experiment: crash
  runs_dir: RUNS_DIR
  services: [env_service, llm_server]
  ports: {env_service: auto, llm_server: auto}
  trainer: false
  restart: {max_restarts: 1, backoff_s: 0.2}
  ray: {enabled: false}
env_service: {environments: [signal]}
llm_server: {model: /nonexistent/model-dir}
""")
    proc, log = start_launcher(conf)
    tree: list[psutil.Process] = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        tree += [p for p in process_tree(proc.pid) if p not in tree]
        time.sleep(0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("launcher did not give up on the crashing service")
    out = log.read_text()
    assert proc.returncode == 1, out
    assert "llm_server exited with code 1; restart 1/1" in out
    assert "llm_server failed: exited with code 1 after 1 restart(s)" in out
    tail = out.split("last lines of", 1)[1]
    assert "llm_server.log" in tail.splitlines()[0]
    assert "not `smollm2`, `tiny` or an existing local HF directory" in tail, "the service's own error is shown"
    assert "stopping env_service" in out
    assert still_running(tree) == []
    run_dir = tmp_path / "runs" / "crash"
    assert listening(planned_ports(run_dir)) == []


def test_a_service_killed_while_running_is_restarted_and_healthy_again(tmp_path):
    conf = write_config(tmp_path, """
launcher:
  experiment: restart
  runs_dir: RUNS_DIR
  services: [env_service]
  ports: {env_service: auto}
  trainer: false
  restart: {max_restarts: 2, backoff_s: 0.2}
  ray: {enabled: false}
env_service: {environments: [signal]}
""")
    proc, log = start_launcher(conf)
    try:
        text = wait_for(log, r"all services healthy", proc, timeout=120)
        pid = int(re.search(r"started env_service on port \d+ \(pid (\d+)", text).group(1))
        second = subprocess.run([sys.executable, "launcher.py", "--conf", str(conf)], cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2
        assert f"another launcher (pid {proc.pid}) is running" in second.stderr, "one launcher per run folder"
        os.kill(pid, signal.SIGKILL)
        text = wait_for(log, r"env_service exited with code -9; restart 1/2 in 0.2s[\s\S]*env_service is healthy",
                        proc, timeout=120)
        assert len(re.findall(r"started env_service", text)) == 2
        port = yaml.safe_load((tmp_path / "runs" / "restart" / "config.yaml").read_text())["env_service"]["port"]
        assert listening([port]) == [port], "the restarted service serves on the same port"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert listening([port]) == []
    assert "===== launcher: starting env_service (restart 1/2)" in (tmp_path / "runs/restart/logs/env_service.log").read_text()


def test_doctor_names_a_missing_api_key_and_passes_otherwise(tmp_path):
    conf = write_config(tmp_path, """
launcher:
  runs_dir: RUNS_DIR
  services: [env_service, judge]
  ports: {env_service: auto, judge: auto}
  trainer: false
  ray: {enabled: false}
env_service: {environments: [signal]}
judge: {llm: {base_url: "https://llm.example/v1", model: m, api_key_env: EVOLVER_TEST_MISSING_KEY}}
""")
    env = {k: v for k, v in os.environ.items() if k != "EVOLVER_TEST_MISSING_KEY"}
    done = subprocess.run([sys.executable, "launcher.py", "doctor", "--conf", str(conf)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 1, done.stdout
    assert "$EVOLVER_TEST_MISSING_KEY is not set" in done.stdout
    assert "put EVOLVER_TEST_MISSING_KEY=... in .env" in done.stdout
    assert re.search(r"ok\s+environments\s+tasks train/validation/test: signal 256/64/64", done.stdout)
    env["EVOLVER_TEST_MISSING_KEY"] = "x"
    done = subprocess.run([sys.executable, "launcher.py", "doctor", "--conf", str(conf)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().endswith("doctor: ready")
