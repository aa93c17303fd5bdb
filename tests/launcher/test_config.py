"""The launcher's run config: one model over every section, filled-in ports/URLs, --with-* flags, dry runs.

Nothing here starts a service: these are the checks that must fail (or plan) before anything starts.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import launcher
from common.config import ConfigError, compose, load_config
from evolver_launcher.plan import build_plan
from evolver_launcher.settings import RunConfig, apply_companion_flags
from tests.helpers import REPO

# The examples the launcher runs; a `verl:` section marks a veRL (GPU) run, started by its own script.
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if "\nverl:" not in p.read_text())
VERL_EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if "\nverl:" in p.read_text())


def small_config(tmp_path: Path, **extra: str) -> Path:
    text = f"""
launcher:
  experiment: unit
  runs_dir: {tmp_path / 'runs'}
  services: [llm_server, env_service, task_manager, experience_manager, judge]
  ports: {{llm_server: auto, env_service: auto, task_manager: auto, experience_manager: auto, judge: auto}}
  ray: {{dashboard_port: auto}}
llm_server: {{model: tiny}}
env_service: {{environments: [flights]}}
task_manager: {{environments: [flights]}}
judge: {{llm: {{base_url: llm_server}}}}
trainer:
  model: tiny
  steps: 2
  rollout: {{env: flights, n: 2}}
"""
    path = tmp_path / "run.yaml"
    path.write_text(text + "".join(extra.values()))
    return path


def plan_for(path: Path, overrides: list[str] | None = None, **flags: bool):
    raw = apply_companion_flags(compose(path, overrides or []), **flags)
    return build_plan(raw, path)


def test_plan_fills_ports_urls_stores_and_roles(tmp_path):
    plan = plan_for(small_config(tmp_path))
    data = plan.data
    ports = {c.name: c.port for c in plan.children if c.port}
    assert len(set(ports.values())) == len(ports), "every child gets its own port"
    env_url = f"http://127.0.0.1:{data['env_service']['port']}"
    assert data["task_manager"]["env_url"] == env_url
    assert data["trainer"]["services"]["env_url"] == env_url
    # where reference-guided attribution fetches references (used only with judge.labeller/reference)
    assert data["judge"]["task_manager_url"] == f"http://127.0.0.1:{data['task_manager']['port']}"
    assert data["judge"]["llm"] == {**data["judge"]["llm"],
                                    "base_url": f"http://127.0.0.1:{data['llm_server']['port']}/v1", "model": "tiny"}
    run_dir = tmp_path / "runs" / "unit"
    assert data["task_manager"]["store_dir"] == str(run_dir / "task_manager")
    assert data["experience_manager"]["store"] == str(run_dir / "experience_store")
    assert data["trainer"]["output_dir"] == str(run_dir / "trainer")
    assert data["trainer"]["ray"]["address"] == plan.ray.address
    names = [c.name for c in plan.children]
    assert names[0] == "ray" and names[-1] == "trainer"
    assert names.index("task_manager") > names.index("env_service")
    assert "llm_server" in plan.child("judge").depends_on
    assert plan.child("trainer").env["RAY_ADDRESS"] == plan.ray.address
    assert plan.child("env_service").env["OMP_NUM_THREADS"] == "1"


def test_resolved_yaml_is_what_every_service_reads(tmp_path):
    """The written config validates again, section by section, with each service's own model."""
    plan = plan_for(small_config(tmp_path))
    written = tmp_path / "resolved.yaml"
    written.write_text(yaml.safe_dump(plan.data))
    for name, field in RunConfig.model_fields.items():
        if name == "verl":
            continue
        model = next(a for a in getattr(field.annotation, "__args__", (field.annotation,)) if a is not type(None))
        settings = load_config(model, written, section=name)
        if name in plan.data and plan.data[name] is not None and hasattr(settings, "port"):
            assert settings.port == plan.data[name]["port"]


@pytest.mark.parametrize("override, key", [
    ("trainer.rollout.nn=3", "trainer.rollout.nn: unknown key"),
    ("env_service.max_instance=3", "env_service.max_instance: unknown key"),
    ("launcher.servics=[judge]", "launcher.servics: unknown key"),
    ("judge.retries=99", "judge.retries"),
    ("trainerr.steps=1", "trainerr: unknown top-level section"),
    # 32 steps' judgments take up to 1 + 10 * 30 + 22 * 31 + 31 * 2 + 1 + 1 = 1047 tokens.
    ("judge.max_output_tokens=500", "judge: Value error, max_output_tokens (500) is below the 1047 tokens"),
    ("trainer.rollout.max_turns=40", "trainer.rollout.max_turns (40) is above judge.max_steps (32)"),
])
def test_unknown_keys_and_bad_values_name_their_path(tmp_path, override, key):
    with pytest.raises(ConfigError) as err:
        plan_for(small_config(tmp_path), [override])
    assert key in str(err.value)


def test_a_port_in_use_is_a_clear_error_and_auto_avoids_it(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"launcher.ports.env_service: port {port} .* in use"):
            plan_for(small_config(tmp_path), [f"launcher.ports.env_service={port}"])
        plan = plan_for(small_config(tmp_path), ["launcher.ports.env_service=auto"])
        assert plan.data["env_service"]["port"] != port


def test_bundled_role_needs_the_bundled_server(tmp_path):
    with pytest.raises(ConfigError, match=r"judge.llm.base_url: `llm_server`"):
        plan_for(small_config(tmp_path), ["launcher.services=[env_service,judge]"])


def test_pool_seeding_needs_synthesis_and_both_managers(tmp_path):
    seeding = ["launcher.synthesis.seed_experience=true"]
    with pytest.raises(ConfigError, match=r"launcher.synthesis.seed_experience: .*episodes > 0"):
        plan_for(small_config(tmp_path), seeding)
    with pytest.raises(ConfigError, match=r"launcher.synthesis.seed_experience: .*experience_manager"):
        plan_for(small_config(tmp_path), [*seeding, "launcher.synthesis.episodes=2",
                                          "launcher.services=[llm_server,env_service,task_manager,judge]"])
    plan = plan_for(small_config(tmp_path), [*seeding, "launcher.synthesis.episodes=2"])
    assert plan.launcher.synthesis.seed_experience and plan.child("trainer").gate_owner == "task_manager"


def test_with_flags_only_add(tmp_path):
    path = small_config(tmp_path)
    base = plan_for(path, ["launcher.services=[env_service]", "launcher.trainer=false"])
    assert [c.name for c in base.children] == ["ray", "env_service"]
    more = plan_for(path, ["launcher.services=[env_service]", "launcher.trainer=false"], with_reme=True,
                    with_bfcl=True)
    assert [c.name for c in more.children] == ["ray", "env_service", "experience_manager"]
    assert list(more.data["env_service"]["environments"]) == ["flights", "bfcl"]
    again = plan_for(path, [], with_reme=True)  # already on: nothing changes, nothing is switched off
    assert sorted(c.name for c in again.children) == sorted(c.name for c in plan_for(path).children)


def test_with_appworld_explains_how_to_install(tmp_path):
    with pytest.raises(ConfigError, match=r"--with-appworld: .*appworld download data"):
        plan_for(small_config(tmp_path), with_appworld=True)


def test_invalid_config_fails_before_anything_starts(tmp_path):
    path = small_config(tmp_path)
    done = subprocess.run([sys.executable, "launcher.py", "--conf", str(path), "trainer.rollout.envv=x"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "trainer.rollout.envv: unknown key" in done.stderr
    assert "started" not in done.stdout
    assert not (tmp_path / "runs").exists(), "no run folder, no log, no process"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_dry_run_of_every_example_prints_the_plan_and_starts_nothing(example, tmp_path, capsys):
    # Ports are `auto` where another run on this machine could hold the configured one.
    code = launcher.main(["--conf", str(example), "--dry-run", f"launcher.runs_dir={tmp_path}",
                          "launcher.ray.dashboard_port=auto"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "processes, in start order:" in out and "dry run: nothing was started" in out
    assert "$ " in out and "-m trainer" in out
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"


def test_dry_run_subprocess_reports_the_commands(tmp_path):
    path = small_config(tmp_path)
    done = subprocess.run([sys.executable, "launcher.py", "--conf", str(path), "--dry-run", "--with-reme"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for module in ("llm_server", "env_service", "task_manager", "experience_manager", "judge", "trainer"):
        assert f"-m {module} " in done.stdout
    assert "ray.scripts.scripts start --head" in done.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("example", VERL_EXAMPLES, ids=[p.name for p in VERL_EXAMPLES])
def test_a_verl_run_points_at_its_script_and_its_services_still_plan(example, tmp_path):
    with pytest.raises(ConfigError, match=r"run_overall_gpu.sh"):
        plan_for(example, [f"launcher.runs_dir={tmp_path}"])
    from trainer.config import ServicesConfig

    wanted = set(compose(example)["trainer"].get("services", {})) - set(ServicesConfig.model_fields)
    if wanted:
        pytest.skip(f"trainer.services lacks {sorted(wanted)} that {example.name} uses (trainer wiring not landed)")
    services = [s for s in ("env_service", "experience_manager", "judge") if s in compose(example)]
    plan = plan_for(example, [f"launcher.runs_dir={tmp_path}", "launcher.trainer=false",
                              f"launcher.services=[{','.join(services)}]", "launcher.ray.enabled=false"])
    assert [c.name for c in plan.children] == [s for s in ("env_service", "experience_manager", "judge")
                                               if s in services]


def test_served_policy_weights_come_only_from_the_trainers_folder_and_ray_has_its_own_temp_dir(tmp_path):
    plan = plan_for(small_config(tmp_path, policy="  policy: {kind: endpoint, url: llm_server}\n"))
    run_dir = tmp_path / "runs" / "unit"
    assert plan.data["llm_server"]["weights_dir"] == str(run_dir / "trainer" / "weights")
    ray = plan.child("ray").argv
    assert ray[ray.index("--temp-dir") + 1] == plan.ray.temp_dir
    assert plan.ray.address_file == Path(plan.ray.temp_dir) / "ray_current_cluster"
    in_process = plan_for(small_config(tmp_path))
    assert in_process.data["llm_server"].get("weights_dir") != str(run_dir / "trainer" / "weights")
