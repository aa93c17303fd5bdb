"""Test helpers: free ports and real service processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
# A two-turn `signal` environment in a few words (look, then answer the signal word): tests whose expected ids or
# scripted replies are written by hand from its wording. Task signal-train-0000's signal is `north`.
SIGNAL_TWO_WORDS_YAML = """env_service:
  environments:
    signal:
      options: [north, south]
      system: play signal
      query: "look at the signal then answer {choices}"
      cue: "signal is {signal}"
      tasks_per_split: {train: 4, validation: 2, test: 2}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: Path) -> None:
        self.proc, self.url, self.log_path = proc, url, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        stop_group(self.proc, sig, timeout)


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15,
               kill_timeout: float = 10) -> None:
    """Send `sig` to the process group of `proc` (started with start_new_session) if it still runs, and SIGKILL it
    when it has not ended `timeout` seconds later."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=kill_timeout)
    except ProcessLookupError:
        pass


@contextmanager
def killed_at_exit(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """`proc` (started with start_new_session), whose process group gets SIGKILL on leaving the block if it
    still runs: a failed check does not leave it behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 120, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"service exited with {proc.returncode} before it was healthy:\n{tail}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url}/healthz not ready after {timeout}s")


@contextmanager
def run_service(module: str, args: Sequence[str] = (), *, env: dict[str, str] | None = None,
                timeout: float = 120, log_dir: Path | None = None,
                port: int | None = None, cwd: Path = REPO) -> Iterator[ServiceProcess]:
    """Start `python -m module --port P *args` in its own process group; yield once /healthz is 200. `cwd` is
    where `-m` finds the module first: another checkout runs that checkout's code."""
    port = port or free_port()
    log_dir = Path(log_dir or os.environ.get("EVOLVER_TEST_LOGS", "/tmp/evolver-test-logs"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{module.replace('.', '_')}-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port), *args], cwd=cwd,
                                env=full_env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    service = ServiceProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        wait_healthy(service.url, proc, timeout, log_path)
        yield service
    finally:
        service.stop()


@contextmanager
def plugin_env_service(folder: Path, plugins: dict[str, str], environments: dict[str, Any]) -> Iterator[ServiceProcess]:
    """`python -m env_service` serving `environments` from `plugins` (module:Class, importable from the repository)
    and the scaffold's `shelves` plugin project (`env_service.new`), written into `folder` as a user's would be."""
    from env_service.new import project_files

    for path, text in project_files("shelves", "plugin").items():
        if path.endswith(".py") and not path.startswith("test_"):
            (folder / path).write_text(text)
    conf = folder / "env.yaml"
    conf.write_text(yaml.safe_dump({"env_service": {
        "plugins": {**plugins, "shelves": "shelves_env:ShelvesEnvironment"}, "environments": environments}}))
    with run_service("env_service", ["--conf", str(conf)],
                     env={"PYTHONPATH": os.pathsep.join([str(folder), str(REPO)])}) as service:
        yield service


class InProcessServer:
    """Serve an ASGI app with uvicorn in a background thread on a free 127.0.0.1 port (real sockets)."""

    def __init__(self, app, port: int | None = None) -> None:
        import threading

        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False,
                                log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("in-process server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def run_env_service(env_yaml: str, directory: Path) -> Iterator[ServiceProcess]:
    """`python -m env_service` configured by the YAML text `env_yaml` (written into `directory`)."""
    conf = Path(directory) / "env.yaml"
    conf.write_text(env_yaml)
    with run_service("env_service", ["--conf", str(conf)]) as service:
        yield service


def write_trainer_conf(path: Path, **trainer: Any) -> Path:
    """A `python -m trainer` YAML at `path`: the tiny model on one torch thread, two tasks a step, no Ray, no
    evaluation, no progress bar, TensorBoard or plots; `trainer` sets the rest (steps, rollout, services, ...)."""
    quiet = {"model": "tiny", "tasks_per_step": 2, "torch_threads": 1, "progress": False, "tensorboard": False,
             "plot": False, "eval": {"before": False, "after": False, "tasks": 2}, "ray": {"enabled": False}}
    path.write_text(json.dumps({"trainer": {**quiet, **trainer}}))  # JSON is YAML
    return path


def config_leaves(data: dict, prefix: str = "") -> dict[str, object]:
    """A composed YAML as `dotted.key.path -> value` (lists and empty mappings are values)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(config_leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def config_drift(ours: dict, theirs: dict, allowed: Sequence[str] = ()) -> list[str]:
    """Key paths where two composed YAMLs differ (a value, or a key only one of them has), except under the
    `allowed` paths (a path allows everything below it)."""
    missing = object()
    a, b = config_leaves(ours), config_leaves(theirs)

    def exempt(path: str) -> bool:
        return any(path == p or path.startswith(f"{p}.") for p in allowed)

    return sorted(p for p in a.keys() | b.keys() if not exempt(p) and a.get(p, missing) != b.get(p, missing))
