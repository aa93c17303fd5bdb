"""From a composed run YAML to a plan: resolved ports and URLs, thread budgets, and one command per child.

Nothing here starts a process. `build_plan` validates the whole run config (after filling in what
the launcher owns: ports, the peers' URLs, store paths under the run folder, thread counts and the
bundled LLM server's URL for roles that ask for it) and returns the children in start order.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from common.addresses import is_loopback
from common.config import ConfigError, validate
from common.service import TOKEN_VARIABLE
from env_service.settings import EnvServiceSettings
from evolver_launcher.preflight import check_environment_section, check_served
from evolver_launcher.ray_services import mentions_placed, node_store_defaults, placed_host
from evolver_launcher.settings import (
    SERVICE_MODULES,
    SERVICE_ORDER,
    LauncherSettings,
    RunConfig,
    ServicePlacement,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_LLM = "llm_server"  # `base_url: llm_server` in any LLM role means the bundled model server

# The trainer's `services` field for each peer service it can use (filled when that field exists).
TRAINER_URL_FIELDS = {"env_service": "env_url", "task_manager": "task_url",
                      "experience_manager": "experience_url", "judge": "judge_url"}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass
class ChildSpec:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # added to the launcher's environment
    port: int | None = None
    health_url: str | None = None  # GET must answer 200
    health_tcp: tuple[str, int] | None = None  # or: this address accepts connections; neither: running is ready
    depends_on: list[str] = field(default_factory=list)
    threads: int | None = None
    foreground: bool = False  # the trainer: the run ends when it ends; its output is echoed
    restartable: bool = True
    stop_timeout_s: float | None = None  # SIGTERM grace; None: the launcher's stop_timeout_s
    ray_head: bool = False  # stopped in Ray's own order (raylet first, gcs_server last)
    restart_argv_extra: list[str] = field(default_factory=list)
    # Called (non-blocking) once the dependencies are ready; the child starts when it returns True.
    gate: Callable[[], bool] | None = None
    gate_owner: str | None = None  # the child whose log explains a gate that fails
    gate_note: str | None = None  # what the gate waits for, for the plan
    # A service run as a Ray actor on the node Ray picks (`launcher.placement`): no local process; its
    # health_url is known once the actor says where it runs.
    placement: ServicePlacement | None = None


@dataclass
class RayPlan:
    mode: str  # "start", "join" or "off"
    address: str | None = None  # host:port of the GCS the trainer joins
    dashboard_url: str | None = None
    ports: dict[str, int] = field(default_factory=dict)  # of a started head: gcs, dashboard, client, agent
    # A started head's own --temp-dir: its session files and address file never land in /tmp/ray,
    # where a later bare `ray.init()` would find them and try to join a dead cluster.
    temp_dir: str | None = None
    node_address: str | None = None  # a started head's --node-ip-address: where other nodes join it

    def join_command(self) -> str | None:
        """What a worker node runs to join a head this launch starts (None when it starts none)."""
        if self.mode != "start":
            return None
        # The node's own address, said: Ray's guess on a machine with several interfaces may not be the one the
        # head reaches.
        return (f"RAY_AUTH_MODE=disabled ray start --address={self.address} --node-ip-address=<this node's address> "
                f"--num-cpus=<cores>")

    @property
    def address_file(self) -> Path | None:
        return Path(self.temp_dir) / "ray_current_cluster" if self.temp_dir else None


@dataclass
class RunToken:
    """The bearer token every child gets as EVOLVER_API_TOKEN: the environment's, or one made for this run."""

    value: str = field(repr=False)
    source: str  # "environment" or "generated"


@dataclass
class Plan:
    experiment: str
    run_dir: Path
    config_path: Path  # the resolved YAML every child reads
    config: RunConfig
    data: dict[str, Any]  # the resolved config as plain data (written to config_path)
    children: list[ChildSpec]
    ray: RayPlan
    studio_url: str | None = None  # the run's page in the studio, when launcher.studio.enabled
    token: RunToken | None = None  # None: every service is on loopback and no token was given

    @property
    def launcher(self) -> LauncherSettings:
        return self.config.launcher

    def child(self, name: str) -> ChildSpec:
        return next(c for c in self.children if c.name == name)


# ------------------------------------------------------------------ ports


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind it now. SO_REUSEADDR, as servers set it: a port whose old connections
    sit in TIME_WAIT is free, one with a listener is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(host: str, taken: set[int]) -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port
    raise ConfigError(f"could not find a free port on {host}")


class PortBook:
    """Hands out the run's ports: a requested one must be free, `auto` gets a free one; no duplicates."""

    def __init__(self, host: str, check: bool = True) -> None:
        self.host, self.check = host, check
        self.taken: dict[int, str] = {}

    def resolve(self, key_path: str, requested: int | str, host: str | None = None) -> int:
        """A port on `host` (default the book's): ports stay unique across hosts, so a plan whose services
        share one address later still holds."""
        host = host or self.host
        if requested == "auto":
            port = pick_free_port(host, set(self.taken))
        else:
            port = int(requested)
            if port in self.taken:
                raise ConfigError(f"{key_path}: port {port} is already given to {self.taken[port]}")
            if self.check and port and not port_is_free(host, port):
                raise ConfigError(f"{key_path}: port {port} on {host} is in use by another process; "
                                  f"stop it, pick another port, or set {key_path}=auto")
        self.taken[port] = key_path
        return port


# ------------------------------------------------------------------ fill-ins


def _experiment_name(launcher: LauncherSettings, conf_path: str | os.PathLike | None) -> str:
    if launcher.experiment:
        return launcher.experiment
    return Path(conf_path).stem if conf_path else "run"


def _default_threads(name: str) -> int:
    cores = os.cpu_count() or 1
    return cores if name in ("llm_server", "trainer") else 1


def thread_budget(launcher: LauncherSettings, name: str) -> int:
    return launcher.threads.get(name, launcher.threads.get("default", _default_threads(name)))


def _walk_llm_roles(node: Any, path: str, found: list[tuple[str, dict]]) -> None:
    """Every mapping with a `base_url` key: an LLM role (judge.llm, task_manager.llm.synthesizer, ...)."""
    if isinstance(node, dict):
        if "base_url" in node:
            found.append((path, node))
        for key, value in node.items():
            _walk_llm_roles(value, f"{path}.{key}" if path else str(key), found)


def _fill_bundled_roles(data: dict[str, Any], services: list[str], llm_url: str | None, model: str | None,
                        trainer: bool, with_token: bool = False) -> None:
    """Point roles written as `base_url: llm_server` at the bundled server (sections that will run only)."""
    roles: list[tuple[str, dict]] = []
    running = {*services, *(["trainer"] if trainer else [])}
    _walk_llm_roles({k: v for k, v in data.items() if k in running}, "", roles)
    for path, role in roles:
        if role.get("base_url") != BUNDLED_LLM:
            continue
        if "llm_server" not in services or llm_url is None:
            raise ConfigError(f"{path}.base_url: `llm_server` points at the bundled model server, which this run "
                              f"does not start; add llm_server to launcher.services or give a real URL")
        role["base_url"] = f"{llm_url}/v1"
        role.setdefault("model", model)
        if with_token:
            role.setdefault("api_key_env", TOKEN_VARIABLE)
    policy = ((data.get("trainer") or {}).get("policy") or {}) if trainer else {}
    if policy.get("url") == BUNDLED_LLM:
        if "llm_server" not in services or llm_url is None:
            raise ConfigError("trainer.policy.url: `llm_server` needs llm_server in launcher.services")
        policy["url"] = llm_url
        policy.setdefault("served_model", model)
        if with_token:
            policy.setdefault("api_key_env", TOKEN_VARIABLE)


def _set_default(section: dict[str, Any], key: str, value: Any) -> None:
    if section.get(key) is None:
        section[key] = value


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    if data.get(name) is None:
        data[name] = {}
    if not isinstance(data[name], dict):
        raise ConfigError(f"{name}: must be a mapping, got {type(data[name]).__name__}")
    return data[name]


# ------------------------------------------------------------------ the plan


def build_plan(raw: dict[str, Any], conf_path: str | os.PathLike | None = None, *, check_ports: bool = True,
               environ: dict[str, str] | None = None) -> Plan:
    """Validate `raw` (composed YAML + overrides + flags), resolve everything the launcher owns, plan children."""
    environ = dict(os.environ if environ is None else environ)
    data: dict[str, Any] = {k: v for k, v in raw.items()}
    launcher = validate(LauncherSettings, data.get("launcher") or {}, root="launcher")
    unknown = sorted(set(data) - set(RunConfig.model_fields))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown top-level section (allowed: {', '.join(RunConfig.model_fields)})")
    experiment = _experiment_name(launcher, conf_path)
    run_dir = (Path(launcher.runs_dir) / experiment).resolve()
    services = [s for s in SERVICE_ORDER if s in launcher.services]
    book = PortBook(launcher.host, check=check_ports)
    urls: dict[str, str] = {}
    advertised = Advertiser(launcher)

    for name in services:
        section = _section(data, name)
        placed = name in launcher.placement
        # A placed service binds its node's address, known once Ray has placed it.
        host = placed_host(name) if placed else launcher.hosts.get(name, launcher.host)  # type: ignore[call-overload]
        model_field = RunConfig.model_fields[name].annotation
        default_port = _section_default_port(model_field)
        requested = launcher.ports.get(name, section.get("port", default_port))  # type: ignore[arg-type]
        port = book.resolve(f"launcher.ports.{name}", requested, _port_check_host(launcher.host if placed else host))
        section["port"], section["host"] = port, host
        scheme = "https" if section.get("tls_certfile") else "http"
        urls[name] = f"{scheme}://{_url_host(advertised.address(name, host))}:{port}"

    ray = _plan_ray(launcher, book, environ)
    token = _run_token(launcher, services, environ)
    _fill_service_state(data, services, urls, ray, run_dir, set(launcher.placement))
    llm = data.get("llm_server") or {}
    served = llm.get("served_model_name") or llm.get("model") or "smollm2"
    _fill_bundled_roles(data, services, urls.get("llm_server"), served, launcher.trainer, token is not None)
    if "llm_server" in services:
        _set_default(data["llm_server"], "threads", thread_budget(launcher, "llm_server"))
    if launcher.trainer:
        _fill_trainer(data, launcher, services, urls, ray, run_dir)

    running = {*services, *(["trainer"] if launcher.trainer else [])}
    dormant = {name: data.pop(name) for name in list(data) if name not in running and name not in ("launcher", "verl")}
    for name, section in dormant.items():
        _check_dormant(name, section)
    config = validate(RunConfig, data)
    _check_environments(config, dormant, services, urls.get("env_service"))
    resolved = {k: v for k, v in config.model_dump(mode="json").items() if v is not None}
    resolved["launcher"]["experiment"] = experiment
    resolved.update({k: v for k, v in dormant.items() if v is not None})  # kept as written, for the record
    config_path = run_dir / "config.yaml"
    children = _children(config, resolved, services, urls, ray, run_dir, config_path, plugin_path(conf_path))
    studio_url = None
    if launcher.studio.enabled:
        studio_host = launcher.hosts.get("studio", launcher.host)
        port = book.resolve("launcher.studio.port", launcher.studio.port, _port_check_host(studio_host))
        studio = _studio_child(launcher, studio_host, port, run_dir)
        children.append(studio)  # after the trainer, which therefore does not wait for it
        studio_url = f"http://{_url_host(advertised.address('studio', studio_host))}:{studio.port}/runs/{experiment}"
    if token is not None:
        for child in children:
            child.env[TOKEN_VARIABLE] = token.value
    return Plan(experiment, run_dir, config_path, config, resolved, children, ray, studio_url, token)


def _check_environments(config: RunConfig, dormant: dict[str, Any], services: list[str], env_url: str | None) -> None:
    """Every environment's settings; the environments the trainer and task manager take from this run's env
    service (not from another one their YAML names) are ones it serves."""
    section = config.env_service
    if section is None and dormant.get("env_service") is not None:
        section = validate(EnvServiceSettings, dormant["env_service"], root="env_service")
    if section is None:
        return
    check_environment_section(section)
    if "env_service" in services:
        trainer, task_manager = config.trainer, config.task_manager
        ours = config.launcher.trainer and trainer is not None and trainer.services.env_url == env_url
        trainer_env = trainer.rollout.env if ours and trainer is not None else None
        task_envs = (task_manager.environments if "task_manager" in services and task_manager is not None
                     and task_manager.env_url == env_url else [])
        check_served(section, trainer_env, task_envs)


def plugin_path(conf_path: str | os.PathLike | None) -> str:
    """PYTHONPATH for the children that import env_service plugins: the config file's folder and the folder
    the launcher runs in (children run in the repository), then whatever PYTHONPATH already holds."""
    folders = [str(Path(conf_path).resolve().parent)] if conf_path else []
    folders.append(str(Path.cwd()))
    if os.environ.get("PYTHONPATH"):
        folders.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(dict.fromkeys(folders))


def _studio_child(launcher: LauncherSettings, host: str, port: int, run_dir: Path) -> ChildSpec:
    argv = [sys.executable, "-m", "studio", "--runs", str(run_dir.parent), "--host", host,
            "--port", str(port), "--refresh-s", str(launcher.studio.refresh_s)]
    return ChildSpec(name="studio", argv=argv, log_path=run_dir / "logs" / "studio.log", env=_base_env(1),
                     port=port, health_url=f"http://{_url_host(_local_host(host))}:{port}/healthz", threads=1)


def _fill_service_state(data: dict[str, Any], services: list[str], urls: dict[str, str], ray: RayPlan,
                        run_dir: Path, placed: set[str]) -> None:
    """Where each service keeps its state (under the run folder unless the YAML says; a placed service's on
    its own node, chosen there) and whom it calls."""
    for name in placed:
        for key, value in node_store_defaults(name).items():
            _set_default(data[name], key, value)
    if "task_manager" in services:
        tm = data["task_manager"]
        if "task_manager" not in placed:
            _set_default(tm, "store_dir", str(run_dir / "task_manager"))
        if "env_service" in services:
            _set_default(tm, "env_url", urls["env_service"])
        elif tm.get("env_url") is None:
            raise ConfigError("task_manager.env_url: no env_service in launcher.services, so give its URL")
        if "experience_manager" in services:  # where pool seeding writes (launcher.synthesis.seed_experience)
            _set_default(tm, "experience_url", urls["experience_manager"])
        trainer = data.get("trainer") or {}
        warm_start = trainer.get("warm_start") or {}
        if ((warm_start.get("enabled") and warm_start.get("source", "synthetic") == "synthetic")
                or ((trainer.get("agent") or {}).get("questioning") is not None)):
            # The trainer's warm start reads them, and an agent's questioning plays them through the agent
            # (POST /v1/training_references).
            _set_default(tm, "serve_training_references", True)
    if "experience_manager" in services:
        em = data["experience_manager"]
        if em.get("qdrant_url") is None and "experience_manager" not in placed:
            _set_default(em, "store", str(run_dir / "experience_store"))
    if "judge" in services:
        if "judge" not in placed:
            _set_default(data["judge"], "audit_log", str(run_dir / "judge" / "audit.jsonl"))
        if "task_manager" in services:  # where reference-guided attribution fetches references
            _set_default(data["judge"], "task_manager_url", urls["task_manager"])
    if "env_service" in services and ray.address and data["env_service"].get("backend") == "ray":
        _set_default(_section(data["env_service"], "ray"), "address", ray.address)


def _fill_trainer(data: dict[str, Any], launcher: LauncherSettings, services: list[str], urls: dict[str, str],
                  ray: RayPlan, run_dir: Path) -> None:
    """The trainer's peers' URLs, output folder, thread budget and the Ray cluster it joins."""
    if data.get("verl") is not None:
        raise ConfigError("verl: this run is for the veRL backend (GPU); start it with examples/run_overall_gpu.sh "
                          "(CONF=<this yaml>). The launcher runs the local trainer; with launcher.trainer=false it "
                          "starts just the services.")
    if data.get("trainer") is None:
        raise ConfigError("trainer: launcher.trainer is true but the YAML has no `trainer` section "
                          "(add one, or set launcher.trainer=false to run the services only)")
    from trainer.config import ServicesConfig, uploads_weights

    trainer = _section(data, "trainer")
    _set_default(trainer, "output_dir", str(run_dir / "trainer"))
    peers = _section(trainer, "services")
    for name, field_name in TRAINER_URL_FIELDS.items():
        if name in services and field_name in ServicesConfig.model_fields:
            _set_default(peers, field_name, urls[name])
    _set_default(peers, "logs_dir", str(run_dir / "logs"))  # outage errors name the peer's log
    budget = thread_budget(launcher, "trainer")
    _set_default(trainer, "torch_threads", budget)
    policy = _section(trainer, "policy")
    if policy.get("kind", "in_process") == "in_process":
        _set_default(policy, "threads", budget)
    ray_section = _section(trainer, "ray")
    if ray.mode == "off":
        _set_default(ray_section, "enabled", False)
    elif ray.address:
        _set_default(ray_section, "address", ray.address)
    if launcher.resume:
        trainer["resume"] = True
    if "llm_server" in launcher.placement and policy.get("kind") == "endpoint" and policy.get("url") == urls.get(
            "llm_server"):
        _upload_to_placed_server(policy)
    if ("llm_server" in services and policy.get("kind") == "endpoint"
            and not uploads_weights(policy.get("weights_transfer", "auto"), str(policy.get("url")))):
        # The trainer writes weights to <output_dir>/weights and names the file; the server loads from nowhere
        # else. Off loopback they travel as the request body instead, and no folder is shared.
        _set_default(_section(data, "llm_server"), "weights_dir", str(Path(trainer["output_dir"]) / "weights"))


def _upload_to_placed_server(policy: dict[str, Any]) -> None:
    """A placed llm_server shares no folder with the trainer: its weights travel as the upload's body. `auto` would
    not say so when the node's address is a loopback one (a test cluster on one machine), so it is made explicit."""
    transfer = policy.get("weights_transfer", "auto")
    if transfer == "path":
        raise ConfigError("trainer.policy.weights_transfer: `path` needs a folder that the trainer and llm_server "
                          "share, and launcher.placement.llm_server runs llm_server on another node; set it to "
                          "http (or auto), or drop launcher.placement.llm_server")
    policy["weights_transfer"] = "http"


def _check_dormant(name: str, section: Any) -> None:
    """A section whose service does not run: its keys and values must still be right, but fields the
    launcher would fill in (URLs, required peers) may be missing."""
    if section is None:
        return
    model = _section_model(name)
    try:
        model.model_validate(section)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if e["type"] != "missing"]
        if not errors:
            return
        lines = []
        for err in errors:
            path = ".".join(str(p) for p in (name, *err["loc"]))
            lines.append(f"{path}: unknown key" if err["type"] == "extra_forbidden"
                         else f"{path}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def _section_model(name: str) -> type[BaseModel]:
    annotation = RunConfig.model_fields[name].annotation
    return next(a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None))


def _section_default_port(annotation: Any) -> int | None:
    for arg in getattr(annotation, "__args__", ()) or (annotation,):
        fields = getattr(arg, "model_fields", None)
        if fields and "port" in fields:
            return fields["port"].default
    return None


# ------------------------------------------------------------------ addresses and the token

WILDCARDS = frozenset({"0.0.0.0", "", "::", "[::]"})


class Advertiser:
    """The address each service's peers use: `launcher.advertise`, else the address it binds, else (bound to a
    wildcard) this node's address as other nodes reach it, never 127.0.0.1 when it listens elsewhere."""

    def __init__(self, launcher: LauncherSettings) -> None:
        self.launcher = launcher
        self._node: str | None = None

    def address(self, name: str, bind: str) -> str:
        configured = self.launcher.advertise.get(name)  # type: ignore[call-overload]
        if configured:
            return configured
        if bind not in WILDCARDS:
            return bind
        return self.node_address()

    def node_address(self) -> str:
        if self._node is None:
            ray_node = self.launcher.ray.node_address
            self._node = (self.launcher.node_address or (ray_node if not is_loopback(ray_node) else None)
                          or _ray_node_ip())
        return self._node


def _ray_node_ip() -> str:
    # Ray's own choice of this node's address (the one a raylet here would register), imported only here:
    # `import ray` costs a second that a plan on loopback never pays.
    from ray.util import get_node_ip_address

    return get_node_ip_address()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _local_host(bind: str) -> str:
    """Where this machine reaches a child it started (its health check)."""
    return "127.0.0.1" if bind in WILDCARDS else bind


def _port_check_host(bind: str) -> str:
    return "0.0.0.0" if bind in WILDCARDS else bind


def _run_token(launcher: LauncherSettings, services: list[str], environ: dict[str, str]) -> RunToken | None:
    """The environment's token, or a new one when a child listens off loopback (which then requires one)."""
    if environ.get(TOKEN_VARIABLE):
        return RunToken(environ[TOKEN_VARIABLE], "environment")
    if any(name in launcher.placement for name in services):
        # A placed service binds whatever address its node has, which the plan cannot know: guarded anyway.
        return RunToken(secrets.token_urlsafe(32), "generated")
    binds = [launcher.hosts.get(name, launcher.host) for name in services]  # type: ignore[call-overload]
    if launcher.studio.enabled:
        binds.append(launcher.hosts.get("studio", launcher.host))
    if any(not is_loopback(host) for host in binds):
        return RunToken(secrets.token_urlsafe(32), "generated")
    return None


def _plan_ray(launcher: LauncherSettings, book: PortBook, environ: dict[str, str]) -> RayPlan:
    if not launcher.ray.enabled:
        return RayPlan("off")
    address = launcher.ray.address or environ.get("RAY_ADDRESS")
    if address:
        return RayPlan("join", address=address)
    ports = {"gcs": book.resolve("launcher.ray.port", launcher.ray.port, launcher.ray.node_address)}
    dashboard_url = None
    if launcher.ray.dashboard:
        ports["dashboard"] = book.resolve("launcher.ray.dashboard_port", launcher.ray.dashboard_port)
        dashboard_url = f"http://127.0.0.1:{ports['dashboard']}"
    # Ray's fixed defaults (10001, 52365) would collide with any other Ray on the machine.
    ports["client_server"] = book.resolve("launcher.ray.client_server_port", launcher.ray.client_server_port)
    ports["dashboard_agent"] = book.resolve("launcher.ray.dashboard_agent_port", "auto")
    temp_dir = str(Path(tempfile.gettempdir()) / f"evolver-ray-{ports['gcs']}")  # short: Ray's socket paths
    node = launcher.ray.node_address
    return RayPlan("start", address=f"{_url_host(node)}:{ports['gcs']}", dashboard_url=dashboard_url, ports=ports,
                   temp_dir=temp_dir, node_address=node)


def _base_env(threads: int) -> dict[str, str]:
    env = {var: str(threads) for var in THREAD_VARIABLES}
    # Idle OpenMP threads spinning on a shared CPU slow every other process down.
    env.update({"OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"), "HF_HUB_OFFLINE": "1"})
    return env


def _children(config: RunConfig, resolved: dict[str, Any], services: list[str], urls: dict[str, str],
              ray: RayPlan, run_dir: Path, config_path: Path, pythonpath: str) -> list[ChildSpec]:
    launcher = config.launcher
    logs = run_dir / "logs"
    children: list[ChildSpec] = []
    python = sys.executable
    if ray.mode == "start":
        children.append(_ray_child(config, ray, logs))
        children[-1].env["PYTHONPATH"] = pythonpath  # env_service's Ray actors import its plugins too
    for name in services:
        threads = thread_budget(launcher, name)
        depends = ["ray"] if ray.mode == "start" else []
        if name == "task_manager" and "env_service" in services:
            depends.append("env_service")
        if name != "llm_server" and "llm_server" in services and _uses_bundled(resolved.get(name), urls):
            depends.append("llm_server")
        section = resolved[name]
        # A service whose config names a placed peer's URL reads it once that peer's node is known.
        depends += [peer for peer in launcher.placement if peer != name and mentions_placed(section, peer)]
        env = _base_env(threads)
        if name == "env_service" or name in launcher.placement:
            env["PYTHONPATH"] = pythonpath
        if name in launcher.placement:
            children.append(ChildSpec(
                name=name, argv=[python, "-m", SERVICE_MODULES[name], "--host", "<its node's address>", "--port",
                                 str(section["port"]), "--conf", "<the run's config, written on its node>"],
                log_path=logs / f"{name}.log", env=env, port=section["port"], depends_on=depends, threads=threads,
                health_url=f"{urls[name].split('://')[0]}://{placed_host(name)}:{section['port']}/healthz",
                placement=launcher.placement[name]))  # type: ignore[index]
            continue
        children.append(ChildSpec(
            name=name,
            argv=[python, "-m", SERVICE_MODULES[name], "--host", section["host"], "--port", str(section["port"]),
                  "--conf", str(config_path)],
            log_path=logs / f"{name}.log", env=env, port=section["port"],
            health_url=f"{urls[name].split('://')[0]}://{_url_host(_local_host(section['host']))}:{section['port']}"
                       f"/healthz", depends_on=depends, threads=threads))
    if launcher.trainer:
        threads = thread_budget(launcher, "trainer")
        env = _base_env(threads)
        # The trainer's end-of-run tables are rich tables written to a log file: render them as wide
        # as the launcher's terminal, where they are echoed.
        env["COLUMNS"] = str(max(100, shutil.get_terminal_size((120, 24)).columns))
        if ray.address:
            env["RAY_ADDRESS"] = ray.address
        children.append(ChildSpec(
            name="trainer", argv=[python, "-m", "trainer", "--conf", str(config_path)],
            log_path=logs / "trainer.log", env=env, depends_on=[c.name for c in children], threads=threads,
            foreground=True, restartable=launcher.restart.trainer, restart_argv_extra=["trainer.resume=true"]))
        if launcher.synthesis.seed_experience and not (
                launcher.synthesis.episodes and {"task_manager", "experience_manager"} <= set(services)):
            raise ConfigError("launcher.synthesis.seed_experience: seeding the pool from synthetic tasks needs "
                              "launcher.synthesis.episodes > 0 and task_manager and experience_manager in "
                              "launcher.services")
        if launcher.synthesis.episodes and "task_manager" in services:
            environments = resolved["task_manager"]["environments"]
            children[-1].gate_owner = "task_manager"
            children[-1].gate_note = (f"a task-manager synthesis job of {launcher.synthesis.episodes} episodes on "
                                      f"{', '.join(environments)}")
    return children


def _uses_bundled(section: Any, urls: dict[str, str]) -> bool:
    roles: list[tuple[str, dict]] = []
    _walk_llm_roles(section, "", roles)
    llm = urls.get("llm_server")
    return llm is not None and any(str(role.get("base_url", "")).startswith(llm) for _, role in roles)


def _ray_child(config: RunConfig, ray: RayPlan, logs: Path) -> ChildSpec:
    launcher = config.launcher
    ports = ray.ports
    num_cpus = launcher.ray.num_cpus or max(2, os.cpu_count() or 1)
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            "--node-ip-address", str(ray.node_address), "--port", str(ports["gcs"]), "--num-cpus", str(num_cpus),
            "--object-store-memory", str(launcher.ray.object_store_memory_mb * 1024 * 1024),
            "--ray-client-server-port", str(ports["client_server"]),
            "--dashboard-agent-listen-port", str(ports["dashboard_agent"]),
            "--disable-usage-stats", "--include-dashboard", "true" if launcher.ray.dashboard else "false",
            "--temp-dir", str(ray.temp_dir)]
    if ray.dashboard_url:
        argv += ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"])]
    if launcher.ray.resources:
        argv += ["--resources", json.dumps(launcher.ray.resources)]
    if launcher.ray.labels:
        argv += ["--labels", ",".join(f"{k}={v}" for k, v in launcher.ray.labels.items())]
    # A crashed head takes the trainer's actors with it: no restart, the run stops with its log.
    return ChildSpec(name="ray", argv=argv, log_path=logs / "ray.log",
                     env={"RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}, port=ports["gcs"],
                     health_url=f"{ray.dashboard_url}/api/version" if ray.dashboard_url else None,
                     health_tcp=None if ray.dashboard_url else (str(ray.node_address), ports["gcs"]),
                     restartable=False, ray_head=True)
