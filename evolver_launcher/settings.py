"""The run config: every service's own section plus the launcher's, validated as one model.

    launcher:
      experiment: quickstart          # runs/<experiment>/ holds logs, config, manifest, stores
      services: [llm_server, env_service, task_manager, experience_manager, judge]
      trainer: true                   # run the trainer once the services are healthy
      ports: {env_service: auto, llm_server: 8001}   # a number (must be free) or auto
      threads: {llm_server: 1, trainer: 2, default: 1}
      restart: {max_restarts: 2, window_s: 600, backoff_s: 1.0}
      ray: {dashboard_port: 8265}
      studio: {enabled: true, port: 8090}   # the web view: http://127.0.0.1:8090/runs/<experiment>

Each service section (`llm_server`, `env_service`, `task_manager`, `experience_manager`, `judge`,
`trainer`) is validated by that service's own settings model, so a typo anywhere fails before
anything starts, with its key path. Only the light settings modules are imported here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from common.config import ConfigError, StrictModel
from env_service.settings import EnvServiceSettings
from experience_manager.settings import ExperienceManagerSettings
from judge.settings import JudgeSettings
from llm_server.settings import LLMServerSettings
from task_manager.settings import TaskManagerSettings
from trainer.config import TrainerConfig

ServiceName = Literal["llm_server", "env_service", "task_manager", "experience_manager", "judge"]
SERVICE_ORDER: tuple[str, ...] = ("llm_server", "env_service", "experience_manager", "judge", "task_manager")
SERVICE_MODULES: dict[str, str] = {
    "llm_server": "llm_server",
    "env_service": "env_service",
    "task_manager": "task_manager",
    "experience_manager": "experience_manager",
    "judge": "judge",
}
Port = int | Literal["auto"]


class RestartPolicy(StrictModel):
    max_restarts: int = Field(default=2, ge=0, description=(
        "restarts per child within window_s; one more crash inside the window stops the run"))
    window_s: float = Field(default=600.0, gt=0, description=(
        "the restart budget's window: a crash older than this no longer counts, so crashes spread over a long "
        "run are all restarted while a crash loop still stops it"))
    backoff_s: float = Field(default=1.0, ge=0, description=(
        "first wait before a restart; doubles with each crash inside the window"))
    backoff_max_s: float = Field(default=30.0, ge=0)
    trainer: bool = Field(default=True, description=(
        "restart a crashed trainer with trainer.resume=true: it continues from its last checkpoint "
        "(trainer.checkpoint.every), so a crash costs at most one checkpoint interval; not after a "
        "configuration error (exit 2), after it gave up on a peer past its outage budget (exit 3), after it "
        "stopped a collapsed run (exit 4), or after a write found the disk full (exit 5)"))


class RayLaunch(StrictModel):
    enabled: bool = Field(default=True, description="start (or join) Ray before the services")
    address: str | None = Field(default=None, description="join this cluster; else $RAY_ADDRESS; else start one")
    port: Port = Field(default="auto", description="GCS port of a started head")
    dashboard: bool = True
    dashboard_port: Port = 8265
    client_server_port: Port = "auto"
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs the head offers (default: all cores)")
    node_address: str = Field(default="127.0.0.1", description=(
        "the address a started head listens on and other nodes join (`ray start --address=<it>:<port>`); "
        "127.0.0.1 keeps the cluster to this machine"))
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "custom resources a started head offers, e.g. {trainer_node: 1}, for placing work by resource"))
    labels: dict[str, str] = Field(default_factory=dict, description=(
        "node labels of a started head, e.g. {evolver/role: head}, for placing work by label"))
    object_store_memory_mb: int = Field(default=512, ge=80, description="shared memory the object store reserves")


class ServicePlacement(StrictModel):
    """A service run as a Ray actor on a node Ray picks, instead of a process on the launcher's machine."""

    node_labels: dict[str, str] = Field(default_factory=dict, description=(
        "the node labels the service's node must have, e.g. {evolver/role: services} (a hard requirement)"))
    resources: dict[str, float] = Field(default_factory=dict, description=(
        "custom resources the service's actor asks for, e.g. {service_node: 1}"))
    num_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves for the service's actor")
    max_restarts: int = Field(default=3, ge=0, description=(
        "how often Ray restarts the service's actor after a crash (its process, or the server in it); once "
        "spent, the run stops"))
    store_root: str | None = Field(default=None, description=(
        "the folder on the service's node that holds its store (task store, experience store, judge audit, "
        "llm_server's weights_dir) under <experiment>/<service>/ (default: the node's temporary folder, "
        "evolver-stores/)"))

    @model_validator(mode="after")
    def _somewhere(self) -> ServicePlacement:
        if not self.node_labels and not self.resources:
            raise ValueError("give node_labels or resources: they say which node runs the service")
        return self


class SynthesisLaunch(StrictModel):
    episodes: int = Field(default=0, ge=0, description="exploration episodes per environment before training "
                                                        "(task manager synthesis job); 0: none")
    timeout_s: float = Field(default=900.0, gt=0)
    seed_experience: bool = Field(
        default=False, description="after the jobs, seed the experience pool (the trainer's workspace) from the "
                                   "verified synthetic tasks' references, replayed; never from held-out tasks")
    allow_no_tasks: bool = Field(
        default=False, description="train on the environment's own tasks when a synthesis job finds no task (every "
                                   "exploration failed, or none gave a verified task); false: the run stops "
                                   "before training, quoting the job's reasons and first error")


class StudioLaunch(StrictModel):
    """The studio (web view of runs) as a child of the run; its URL is printed beside the Ray dashboard's."""

    enabled: bool = Field(default=False, description="start `python -m studio` over runs_dir with the run")
    port: Port = Field(default="auto", description="a free port, or auto")
    refresh_s: float = Field(default=5.0, gt=0, description="how often a live run page polls")


class LauncherSettings(StrictModel):
    experiment: str | None = Field(default=None, description="run name (default: the YAML file's name)")
    runs_dir: str = "runs"
    resume: bool = Field(default=False, description="reuse runs/<experiment>; else an old one is moved aside")
    services: list[ServiceName] = Field(default_factory=list, description="services to start, in any order")
    trainer: bool = Field(default=True, description="run the trainer once every service is healthy")
    host: str = Field(default="127.0.0.1", description="address every service binds unless `hosts` names it")
    hosts: dict[ServiceName | Literal["studio"], str] = Field(default_factory=dict, description=(
        "per service: the address it binds (default `host`)"))
    advertise: dict[ServiceName, str] = Field(default_factory=dict, description=(
        "per service: the address its peers use to reach it (default: the bind address, or this node's "
        "address when it binds a wildcard such as 0.0.0.0)"))
    node_address: str | None = Field(default=None, description=(
        "this node's address as other nodes reach it, advertised for services bound to a wildcard "
        "(default: launcher.ray.node_address when it is not loopback, else Ray's own guess of this node's IP)"))
    ports: dict[ServiceName, Port] = Field(default_factory=dict, description="per service: a free port or auto")
    threads: dict[str, int] = Field(default_factory=dict,
                                    description="torch/OMP threads per child (service name, trainer, default)")
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    health_timeout_s: float = Field(default=300.0, gt=0, description="per service, from start to /healthz 200")
    stop_timeout_s: float = Field(default=15.0, gt=0, description="SIGTERM grace before SIGKILL")
    log_tail_lines: int = Field(default=40, ge=1)
    ray: RayLaunch = Field(default_factory=RayLaunch)
    placement: dict[ServiceName, ServicePlacement] = Field(default_factory=dict, description=(
        "per service: run it as a Ray actor on a node chosen by labels or resources, restarted by Ray; it binds "
        "and advertises that node's address and keeps its store there (a placed llm_server gets the trainer's "
        "weights as the body of POST /v1/weights/upload)"))
    synthesis: SynthesisLaunch = Field(default_factory=SynthesisLaunch)
    studio: StudioLaunch = Field(default_factory=StudioLaunch)

    @field_validator("experiment")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", value):
            raise ValueError("use letters, digits, '_', '.' and '-' (it names a folder)")
        return value

    @field_validator("threads")
    @classmethod
    def _thread_keys(cls, value: dict[str, int]) -> dict[str, int]:
        allowed = {*SERVICE_MODULES, "trainer", "default"}
        for key, count in value.items():
            if key not in allowed:
                raise ValueError(f"threads.{key}: unknown child (allowed: {', '.join(sorted(allowed))})")
            if count < 1:
                raise ValueError(f"threads.{key}: must be at least 1")
        return value

    @field_validator("placement")
    @classmethod
    def _placed_services_run_here(cls, value: dict[str, ServicePlacement],
                                  info: ValidationInfo) -> dict[str, ServicePlacement]:
        # services, hosts and ray are declared above placement: pydantic has checked them already.
        services, hosts, ray = info.data.get("services", []), info.data.get("hosts", {}), info.data.get("ray")
        for name in value:
            if name not in services:
                raise ValueError(f"{name}: {name} is not in launcher.services; add it there or drop its placement")
            if name in hosts:
                raise ValueError(f"{name}: a placed service binds the address of the node Ray puts it on; drop "
                                 f"launcher.hosts.{name} (launcher.advertise.{name} names another address for peers)")
        if value and ray is not None and not ray.enabled:
            raise ValueError(f"{next(iter(value))}: placed services run as Ray actors; set launcher.ray.enabled=true")
        return value

    @field_validator("services")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class RunConfig(StrictModel):
    """The whole run YAML. A section may be present for a service that is not started (it is still checked)."""

    launcher: LauncherSettings = Field(default_factory=LauncherSettings)
    llm_server: LLMServerSettings | None = None
    env_service: EnvServiceSettings | None = None
    task_manager: TaskManagerSettings | None = None
    experience_manager: ExperienceManagerSettings | None = None
    judge: JudgeSettings | None = None
    trainer: TrainerConfig | None = None
    # The veRL backend's section (GPU runs through examples/run_overall_gpu.sh). Checked there, by
    # `python -m trainer.verl_plugin`: importing veRL here would add ~15 s to every launch.
    verl: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _judge_labels_the_longest_trajectory(self) -> RunConfig:
        # One judge step per policy turn: a trajectory longer than judge.max_steps could not be labelled
        # in full within the judge's output cap.
        if self.judge is not None and self.trainer is not None and self.trainer.rollout.max_turns > self.judge.max_steps:
            raise ValueError(f"trainer.rollout.max_turns ({self.trainer.rollout.max_turns}) is above judge.max_steps "
                             f"({self.judge.max_steps}): the judge's answer for the longest trajectory must fit "
                             f"judge.max_output_tokens; raise judge.max_steps (and judge.max_output_tokens if the "
                             f"check on it then fails) or lower trainer.rollout.max_turns")
        return self


APPWORLD_HELP = (
    "--with-appworld: no AppWorld environment is available in this install. It needs the `appworld` package "
    "and its data (`pip install appworld && appworld install && appworld download data`, then set "
    "APPWORLD_ROOT), and an environment class registered under env_service.plugins.appworld "
    "('module:Class'). Until then, run without --with-appworld."
)


def apply_companion_flags(raw: dict[str, Any], *, with_reme: bool = False, with_bfcl: bool = False,
                          with_appworld: bool = False) -> dict[str, Any]:
    """AgentEvolver-style `--with-*`: switch companions on on top of the YAML; never switch anything off."""
    launcher = raw.setdefault("launcher", {}) or {}
    raw["launcher"] = launcher
    services: list[str] = list(launcher.get("services") or [])

    def enable(name: str) -> None:
        if name not in services:
            services.append(name)
        if raw.get(name) is None:
            raw[name] = {}

    def add_environment(env: str) -> None:
        enable("env_service")
        section = raw["env_service"]
        environments = section.get("environments")
        if environments is None:
            return  # the env service's defaults already include flights, gym and bfcl
        if isinstance(environments, list):
            if env not in environments:
                environments.append(env)
        elif isinstance(environments, dict):
            environments.setdefault(env, {})

    if with_reme:
        enable("experience_manager")
    if with_bfcl:
        add_environment("bfcl")
    if with_appworld:
        if not _appworld_available(raw):
            raise ConfigError(APPWORLD_HELP)
        add_environment("appworld")
    launcher["services"] = services
    return raw


def _appworld_available(raw: dict[str, Any]) -> bool:
    import importlib.util
    import os

    from env_service.settings import BUILTIN_ENVIRONMENTS

    plugins = ((raw.get("env_service") or {}).get("plugins") or {})
    registered = "appworld" in BUILTIN_ENVIRONMENTS or "appworld" in plugins
    data = bool(os.environ.get("APPWORLD_ROOT")) and importlib.util.find_spec("appworld") is not None
    return registered and data
