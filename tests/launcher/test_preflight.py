"""Pre-flight: a run's environments are checked before anything starts, each failure one line naming the fix.

`--dry-run` rejects unknown keys in an environment's settings (a plugin's too), a plugin class its module
lacks, and environments the env service will not serve; the launcher's start refuses a remote that does not answer and a plugin that does not import;
env_service's /healthz names a remote that stopped answering.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import launcher
from common.config import ConfigError, compose
from env_service.app import build_app
from env_service.registry import load_environments
from env_service.settings import EnvServiceSettings
from evolver_launcher.plan import build_plan
from tests.helpers import REPO, InProcessServer, free_port


def run_yaml(tmp_path: Path, environments: str, rollout_env: str = "flights", plugins: str = "{}") -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(f"""
launcher:
  experiment: preflight
  runs_dir: {tmp_path / 'runs'}
  services: [env_service]
  ports: {{env_service: auto}}
  ray: {{enabled: false}}
env_service:
  environments: {environments}
  plugins: {plugins}
trainer:
  model: tiny
  steps: 1
  ray: {{enabled: false}}
  rollout: {{env: {rollout_env}, n: 2}}
""")
    return path


def dry_run(path: Path, capsys, *overrides: str) -> tuple[int, str]:
    code = launcher.main(["--conf", str(path), "--dry-run", *overrides])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_dry_run_rejects_an_unknown_key_in_the_remote_settings(tmp_path, capsys):
    path = run_yaml(tmp_path, "{remote: {url: 'http://127.0.0.1:9', env_type: inventory, urll: x}}", "remote")
    code, out = dry_run(path, capsys)
    assert code == 2 and "env_service.environments.remote.urll: unknown key" in out, out
    assert "allowed keys: api_token_env, env_type" in out


def test_a_remote_without_env_type_says_what_to_name(tmp_path, capsys):
    code, out = dry_run(run_yaml(tmp_path, "{remote: {url: 'http://127.0.0.1:9'}}", "remote"), capsys)
    assert code == 2 and "env_type is missing" in out and "Field required" not in out, out


def test_dry_run_rejects_a_rollout_environment_the_service_does_not_serve(tmp_path, capsys):
    code, out = dry_run(run_yaml(tmp_path, "[flights]"), capsys, "trainer.rollout.env=inventory")
    assert code == 2, out
    assert "trainer.rollout.env: 'inventory' is not served by this run's env_service (it serves flights)" in out


def test_dry_run_rejects_an_environment_nothing_registers(tmp_path, capsys):
    code, out = dry_run(run_yaml(tmp_path, "[flights, inventory]"), capsys)
    assert code == 2 and "env_service.environments.inventory: unknown environment" in out, out


def test_a_dead_remote_stops_the_launch_before_anything_starts(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    path = run_yaml(tmp_path, f"{{remote: {{url: '{dead}', env_type: inventory}}}}", "remote")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "launcher.py", "--conf", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"the remote env server {dead} did not answer (ConnectError" in done.stderr
    assert "nothing was started" in done.stderr and time.monotonic() - started < 60
    assert not (tmp_path / "runs" / "preflight" / "logs").exists()


def test_plugins_import_from_the_config_folder_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "my_rooms.py").write_text("from env_service.environments.signal import SignalEnvironment as Rooms\n")
    path = run_yaml(tmp_path, "{rooms: {}}", "rooms", "{rooms: 'my_rooms:Rooms', extra: 'no_such_module'}")
    plan = build_plan(compose(path), path)
    problems = launcher._preflight(plan)
    assert len(problems) == 1, problems
    assert problems[0].startswith("env_service.plugins.extra: cannot import no_such_module: ModuleNotFoundError")
    assert str(tmp_path) in plan.child("env_service").env["PYTHONPATH"]


def test_dry_run_names_a_missing_plugin_class_and_a_plugins_unknown_key(tmp_path, capsys):
    (tmp_path / "library_env.py").write_text(
        "from tests.env_service.library_desk import LibraryDesk as LibraryEnvironment\n")
    misspelled = run_yaml(tmp_path, "{library: {}}", "library", "{library: 'library_env:LibraryEnviroment'}")
    code, out = dry_run(misspelled, capsys)
    assert code == 2, out
    assert "env_service.plugins.library: module library_env has no 'LibraryEnviroment'" in out
    assert "its Environment classes: LibraryEnvironment" in out and "dry run: nothing was started" in out

    typo = run_yaml(tmp_path, "{library: {tasks_per_splt: 4}}", "library", "{library: 'library_env:LibraryEnvironment'}")
    code, out = dry_run(typo, capsys)
    assert code == 2 and "env_service.environments.library.tasks_per_splt: unknown key" in out, out
    # The service refuses it the same way at its own start.
    with pytest.raises(ConfigError, match=r"env_service.environments.library.tasks_per_splt: unknown key"):
        load_environments({"library": {"tasks_per_splt": 4}}, {"library": "tests.env_service.library_desk:LibraryDesk"})


def test_env_service_exits_2_on_a_plugin_that_does_not_import(tmp_path):
    conf = tmp_path / "env.yaml"
    conf.write_text("env_service:\n  environments: [flights]\n  plugins: {extra: no_such_module}\n")
    done = subprocess.run([sys.executable, "-m", "env_service", "--port", str(free_port()), "--conf", str(conf)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "env_service.plugins.extra: cannot import no_such_module" in done.stderr


@pytest.mark.timeout(60)
def test_healthz_names_a_remote_that_stopped_answering():
    upstream = InProcessServer(build_app(EnvServiceSettings(environments={"flights": {}})))
    remote = {"url": upstream.url, "env_type": "flights", "timeout_s": 5}
    with upstream, InProcessServer(build_app(EnvServiceSettings(environments={"remote": remote}))) as service:
        assert httpx.get(f"{service.url}/healthz").status_code == 200
        upstream.server.should_exit = True
        upstream.thread.join(timeout=10)
        answer = httpx.get(f"{service.url}/healthz", timeout=10)
        assert answer.status_code == 503
        body = answer.json()
        assert body["status"] == "unavailable"
        assert f"the remote env server {upstream.url} (env_type 'flights') did not answer" in body["reason"]


def test_a_trainer_pointed_at_another_env_service_is_not_held_to_this_ones_environments(tmp_path, capsys):
    path = run_yaml(tmp_path, "[flights]")
    code, out = dry_run(path, capsys, "trainer.rollout.env=inventory", "trainer.services.env_url=http://127.0.0.1:9")
    assert code == 0, out
