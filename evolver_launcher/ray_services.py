"""Services placed on Ray nodes (`launcher.placement`): one restartable Ray actor per service.

The actor (`ServiceHost`) runs on the node Ray picks by labels and resources. It binds that node's address
(as Ray sees it), writes the run's config and keeps the service's store under a folder local to the node,
and runs the service's own server (`python -m <service>`) as its child, which the kernel kills when the
actor's process dies (PR_SET_PDEATHSIG). When the server exits, the actor exits too, so a crash of either is
one actor failure that Ray restarts (`max_restarts`) on a node that matches, the same port and folder again.

The launcher holds a `PlacedService` per placed service: it creates the actor (owned by the launcher's Ray
driver, so the actor dies with the launcher at the latest), learns its node and address through Ray, and
watches it through Ray: a call that fails while Ray restarts the actor, or for good once Ray gave up.
Ray is imported only here and only when a run places a service.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.processes import signal_on_parent_death
from evolver_launcher.run_files import move_aside, tail

REPO_ROOT = Path(__file__).resolve().parent.parent
PLACED_HOST_SUFFIX = ".ray-placed.invalid"  # `.invalid` never resolves: a URL holding it was not filled in

# Per service: the keys that hold its state, and their place under the node's store folder. llm_server's is the
# only folder it loads weights from by path; a placed one gets them uploaded, so it stays empty unless a user
# copies weights there.
STORE_KEYS: dict[str, dict[str, str]] = {
    "task_manager": {"store_dir": "task_manager"},
    "experience_manager": {"store": "experience_store"},
    "judge": {"audit_log": "judge/audit.jsonl"},
    "llm_server": {"weights_dir": "weights"},
}
NODE_STORE = "<node store>"  # a path's start, in the plan, that the actor resolves to its node's store folder


def node_store_defaults(service: str) -> dict[str, str]:
    """The plan's values for a placed service's state paths that the YAML leaves unset."""
    return {key: f"{NODE_STORE}/{relative}" for key, relative in STORE_KEYS.get(service, {}).items()}


def placed_host(service: str) -> str:
    """The host in peers' URLs until the service's actor says which node it runs on."""
    return f"{service}{PLACED_HOST_SUFFIX}"


def fill_address(node: Any, service: str, address: str) -> Any:
    """`node` (the run's config data) with the service's placeholder host replaced by its node's address."""
    if isinstance(node, dict):
        return {k: fill_address(v, service, address) for k, v in node.items()}
    if isinstance(node, list):
        return [fill_address(v, service, address) for v in node]
    if isinstance(node, str):
        return node.replace(placed_host(service), address)
    return node


def mentions_placed(node: Any, service: str) -> bool:
    return placed_host(service) in yaml.safe_dump(node)


def _kill_with_parent() -> None:
    signal_on_parent_death(signal.SIGKILL)


class ServiceHost:
    """A service's server on this node. Ray calls `__init__` again on a restart: same port, same store."""

    def __init__(self, service: str, module: str, port: int, config: dict[str, Any], env: dict[str, str],
                 store_root: str | None, experiment: str) -> None:
        import ray

        self.service, self.port = service, port
        self.node_ip = ray.util.get_node_ip_address()
        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        root = Path(store_root or Path(tempfile.gettempdir()) / "evolver-stores") / experiment / service
        if not context.was_current_actor_reconstructed and not config.get("launcher", {}).get("resume"):
            move_aside(root)  # a new run starts from an empty store, as its run folder does; a restart reopens it
        root.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(config)
        section = config[service]
        section["host"], section["port"] = self.node_ip, port
        for key in STORE_KEYS.get(service, {}):
            value = section.get(key)
            if isinstance(value, str) and value.startswith(NODE_STORE):
                section[key] = str(root) + value.removeprefix(NODE_STORE)
        conf = root / "config.yaml"
        conf.write_text(yaml.safe_dump(config, sort_keys=False))
        self.store, self.log_path = str(root), root / f"{service}.log"
        self._stopping = False
        with self.log_path.open("ab") as log:
            log.write(f"\n===== ServiceHost: starting {service} on {self.node_ip}:{port} (node {self.node_id})\n"
                      .encode())
            log.flush()
            # The actor's main thread creates the child and lives as long as the actor: PDEATHSIG follows the
            # creating thread, so the server dies with the actor's process and never outlives it on its port.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, "--host", self.node_ip, "--port", str(port), "--conf", str(conf)],
                cwd=REPO_ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, preexec_fn=_kill_with_parent)
        threading.Thread(target=self._exit_with_server, daemon=True).start()

    def _exit_with_server(self) -> None:
        code = self.proc.wait()
        if not self._stopping:
            # A server that died is this actor's failure: Ray restarts the actor, which starts the server again.
            os._exit(70 if code == 0 else 71)

    def where(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "node_ip": self.node_ip, "port": self.port, "actor_pid": os.getpid(),
                "server_pid": self.proc.pid, "store": self.store, "log": str(self.log_path)}

    def log_tail(self, lines: int) -> str:
        return tail(self.log_path, lines)

    def stop(self, grace_s: float) -> int | None:
        self._stopping = True
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@dataclass
class Seen:
    """What the launcher last learnt from a placed service's actor."""

    state: str  # "waiting" (no answer yet to the last question), "up", "restarting" or "dead"
    where: dict[str, Any] | None = None
    error: str | None = None


class PlacedService:
    """The launcher's side of one placed service: create the actor, follow it through Ray, kill it."""

    def __init__(self, service: str, module: str, port: int, placement: Any, ray_address: str | None,
                 experiment: str) -> None:
        self.service, self.module, self.port = service, module, port
        self.placement, self.ray_address, self.experiment = placement, ray_address, experiment
        self.actor: Any = None
        self._pending: Any = None
        self.where: dict[str, Any] | None = None

    def wanted(self) -> str:
        wanted = [f"{k}={v}" for k, v in self.placement.node_labels.items()]
        wanted += [f"{k}:{v:g}" for k, v in self.placement.resources.items()]
        return ", ".join(wanted)

    def describe(self) -> str:
        return f"a Ray actor on a node with {self.wanted()} (restarted by Ray up to {self.placement.max_restarts} times)"

    def _connect(self) -> Any:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=self.ray_address, log_to_driver=False, logging_level="WARNING",
                     namespace=f"evolver-{self.experiment}")
        return ray

    def start(self, config: dict[str, Any], env: dict[str, str]) -> None:
        ray = self._connect()
        placement = self.placement
        options: dict[str, Any] = {"num_cpus": placement.num_cpus, "max_restarts": placement.max_restarts,
                                   "max_task_retries": 0, "name": f"evolver-{self.service}"}
        if env.get("PYTHONPATH"):  # this module and the env service's plugins, imported by the actor's worker
            options["runtime_env"] = {"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}}
        if placement.resources:
            options["resources"] = dict(placement.resources)
        if placement.node_labels:
            from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

            # Hard: a service placed on a node kind must not fall back to another kind.
            options["scheduling_strategy"] = NodeLabelSchedulingStrategy(
                hard={k: In(v) for k, v in placement.node_labels.items()})
        actor_class = ray.remote(ServiceHost)
        self.actor = actor_class.options(**options).remote(self.service, self.module, self.port, config, env,
                                                           placement.store_root, self.experiment)
        self._pending = self.actor.where.remote()

    def poll(self) -> Seen:
        """Non-blocking: the actor's answer to the last "where do you run?" (a new one is asked once it came),
        that none came yet, or why none will (Ray is restarting the actor, or it is gone for good)."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

        if self._pending is None:
            self._pending = self.actor.where.remote()
        ready, _ = ray.wait([self._pending], timeout=0)
        if not ready:
            return Seen("waiting", self.where)
        ref, self._pending = self._pending, None
        try:
            self.where = ray.get(ref, timeout=0)
        except ActorUnavailableError as exc:
            return Seen("restarting", self.where, str(exc).splitlines()[0])
        except (ActorDiedError, RayActorError) as exc:
            restarting = "restart" in str(exc).lower() and "max_restarts" not in str(exc)
            return Seen("restarting" if restarting else "dead", self.where, _first_line(exc))
        except GetTimeoutError:
            return Seen("waiting", self.where)
        return Seen("up", self.where)

    def log_tail(self, lines: int) -> str:
        import ray

        try:
            return ray.get(self.actor.log_tail.remote(lines), timeout=5)
        except Exception as exc:  # the actor is gone: say so instead of a tail
            return f"(the actor of {self.service} cannot be reached: {_first_line(exc)})"

    def stop(self, grace_s: float) -> None:
        import ray

        if self.actor is None:
            return
        if self.where is None:  # never placed, or never answered: nothing to stop gracefully
            ray.kill(self.actor, no_restart=True)
            self.actor = None
            return
        try:
            ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 5)
        except Exception:  # noqa: BLE001 - already dead or restarting: the kill below ends it either way
            pass
        ray.kill(self.actor, no_restart=True)
        self.actor = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def disconnect() -> None:
    """The launcher's Ray driver, when placed services made one: its end kills any actor left."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
