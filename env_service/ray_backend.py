"""The `ray` backend: a fixed pool of actors, each hosting many instances, placed over the cluster's nodes.

An instance lives on one actor for its whole life (affinity: its state is in that process), so this
backend routes every call for an instance to the actor that holds it; Ray's own pools (ActorPool, Serve
replicas) send a call to whichever replica is free, which would lose the instance. Ray places the actors
(`ray.placement`, `ray.node_labels`, `ray.resources`: Ray's scheduling strategies and resources).
New instances go to the least-loaded actor. When an actor dies (its process, or its whole node), only the
instances it hosted fail (410 `instance_lost`, naming the cause) and a fresh actor takes its slot, wherever
Ray can place it now. `where(instance)` names the actor, its process and its node.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from typing import Any

import ray
from loguru import logger
from ray.exceptions import RayActorError

from common.schemas import ChatMessage
from env_service.backends import Backend, InstanceLostError
from env_service.environments.base import EvalResult, StepResult
from env_service.host import HostError, InstanceHost
from env_service.settings import RaySettings

_LOST_MEMORY = 10_000  # how many lost instance ids we remember, to explain later calls


@ray.remote
class EnvHostActor:
    """Hosts instances of every enabled environment; methods run on up to max_concurrency threads."""

    def __init__(self, enabled: dict[str, Any], plugins: dict[str, str]) -> None:
        from env_service.registry import load_environments

        self.host = InstanceHost(load_environments(enabled, plugins))

    def pid(self) -> int:
        return os.getpid()

    def whereabouts(self) -> dict[str, Any]:
        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": context.get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}

    def call(self, method: str, *args: Any) -> tuple[bool, Any]:
        # Errors travel as plain tuples: cheaper and more predictable than pickled exceptions.
        try:
            return True, getattr(self.host, method)(*args)
        except HostError as exc:
            return False, exc.as_tuple()
        except Exception as exc:
            return False, (500, "environment_error", f"{method} failed: {type(exc).__name__}: {exc}", None)


class RayBackend(Backend):
    name = "ray"

    def __init__(self, enabled: dict[str, Any], plugins: dict[str, str], settings: RaySettings) -> None:
        self.enabled, self.plugins, self.settings = enabled, plugins, settings
        self._actors: list[Any] = []
        self._loads: list[int] = []
        self._placement: dict[str, int] = {}
        self._lost: OrderedDict[str, str] = OrderedDict()
        self._pending_lost: dict[str, str] = {}
        self._started_ray = False
        self._hosts: list[dict[str, Any] | None] = []  # per slot: pid, node id and address, once known
        self.replacements = 0

    async def start(self) -> None:
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # Join the configured cluster or $RAY_ADDRESS (the launcher's); else start a fresh local
            # one: a bare ray.init() would join whatever cluster a stale /tmp/ray session names.
            address = self.settings.address or os.environ.get("RAY_ADDRESS") or "local"
            ray.init(address=address, include_dashboard=False, configure_logging=False,
                     log_to_driver=True, ignore_reinit_error=True)
            self._started_ray = True
        self._actors = [self._spawn() for _ in range(self.settings.actors)]
        self._loads = [0] * len(self._actors)
        self._hosts = list(await asyncio.gather(*(actor.whereabouts.remote() for actor in self._actors)))
        nodes = sorted({h["node_id"][:8] for h in self._hosts if h})
        logger.info("ray backend: {} actors ready on {} node(s): {}", len(self._actors), len(nodes), ", ".join(nodes))

    def _spawn(self) -> Any:
        return EnvHostActor.options(num_cpus=self.settings.num_cpus, max_concurrency=self.settings.max_concurrency,
                                    max_restarts=0, resources=dict(self.settings.resources) or None,
                                    **placement_options(self.settings)).remote(self.enabled, self.plugins)

    async def close(self) -> None:
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:  # already dead
                pass
        self._actors = []
        if self._started_ray:
            ray.shutdown()

    # ------------------------------------------------------------ calls

    async def create(self, instance_id: str, env_name: str, task_id: str,
                     params: dict[str, Any]) -> list[ChatMessage]:
        slot = min(range(len(self._loads)), key=self._loads.__getitem__)
        self._placement[instance_id] = slot
        self._loads[slot] += 1
        try:
            messages = await self._call(instance_id, "create", env_name, task_id, params)
        except BaseException:
            if self._placement.get(instance_id) == slot:
                del self._placement[instance_id]
                self._loads[slot] -= 1
            raise
        if self._hosts[slot] is None:  # a replacement not yet asked where it runs: the record must say
            await self._learn_whereabouts(slot)
        return messages

    async def _learn_whereabouts(self, slot: int) -> None:
        actor = self._actors[slot]
        try:
            host = await asyncio.wait_for(actor.whereabouts.remote(), timeout=self.settings.health_check_s)
        except (RayActorError, asyncio.TimeoutError):
            return  # dead or busy: the next health check asks again
        if self._actors[slot] is actor:
            self._hosts[slot] = host

    async def step(self, instance_id: str, action: ChatMessage) -> StepResult:
        return await self._call(instance_id, "step", action)

    async def evaluate(self, instance_id: str, params: dict[str, Any]) -> EvalResult:
        return await self._call(instance_id, "evaluate", params)

    async def state(self, instance_id: str) -> dict[str, Any]:
        return await self._call(instance_id, "state")

    async def fork(self, instance_id: str, new_id: str) -> None:
        # The copy lives on the original's actor: its state is in that process.
        await self._call(instance_id, "fork", new_id)
        slot = self._placement.get(instance_id)
        if slot is None:  # the actor died right after the copy: the copy went with it
            raise InstanceLostError(new_id, self._lost.get(instance_id, "its Ray actor died"))
        self._placement[new_id] = slot
        self._loads[slot] += 1

    async def release(self, instance_id: str) -> bool:
        self._lost.pop(instance_id, None)
        if instance_id not in self._placement:
            return False
        try:
            released = await self._call(instance_id, "release")
        except InstanceLostError:
            return True  # its actor died: the instance is gone, which is what release wanted
        slot = self._placement.pop(instance_id, None)
        if slot is not None:
            self._loads[slot] -= 1
        return bool(released)

    async def discard(self, instance_id: str) -> None:
        slot = self._placement.pop(instance_id, None)
        if slot is None:
            return
        self._loads[slot] -= 1
        try:
            await self._actors[slot].call.remote("discard", instance_id)
        except RayActorError:
            pass  # the actor is gone, and the instance with it

    async def _call(self, instance_id: str, method: str, *args: Any) -> Any:
        slot = self._placement.get(instance_id)
        if slot is None:
            reason = self._lost.get(instance_id)
            if reason is not None:
                raise InstanceLostError(instance_id, reason)
            raise HostError(404, "unknown_instance", f"no live instance {instance_id!r}")
        actor = self._actors[slot]
        try:
            ok, value = await actor.call.remote(method, instance_id, *args)
        except RayActorError as exc:
            self._on_actor_death(slot, actor, f"its Ray actor died ({type(exc).__name__})")
            raise InstanceLostError(instance_id, self._lost.get(instance_id, "its Ray actor died")) from None
        if not ok:
            raise HostError(*value)
        return value

    # ------------------------------------------------------------ failures

    def _on_actor_death(self, slot: int, actor: Any, reason: str) -> None:
        if self._actors[slot] is not actor:
            return  # another call already replaced it
        lost = [iid for iid, s in self._placement.items() if s == slot]
        for iid in lost:
            del self._placement[iid]
            self._remember_lost(iid, reason)
            self._pending_lost[iid] = reason
        self._actors[slot] = self._spawn()
        self._hosts[slot] = None  # learnt at the next health check
        self._loads[slot] = 0
        self.replacements += 1
        logger.warning("ray actor {} died ({}); {} instances lost; replaced", slot, reason, len(lost))

    def _remember_lost(self, instance_id: str, reason: str) -> None:
        self._lost[instance_id] = reason
        while len(self._lost) > _LOST_MEMORY:
            self._lost.popitem(last=False)

    async def check_health(self) -> dict[str, str]:
        """Ping every actor; replace the dead ones. Returns the instances lost since the last check."""
        actors = list(self._actors)
        results = await asyncio.gather(*(self._ping(actor) for actor in actors))
        for slot, (actor, host) in enumerate(zip(actors, results, strict=True)):
            if host is None:
                self._on_actor_death(slot, actor, "its Ray actor died")
            elif host and self._actors[slot] is actor:
                self._hosts[slot] = host
        lost, self._pending_lost = self._pending_lost, {}
        return lost

    async def _ping(self, actor: Any) -> dict[str, Any] | None:
        """Where the actor runs; None when it is dead; {} when it is alive but too busy to answer (or a
        replacement Ray has not placed yet)."""
        try:
            return await asyncio.wait_for(actor.whereabouts.remote(), timeout=self.settings.health_check_s)
        except RayActorError:
            return None
        except asyncio.TimeoutError:
            return {}

    def where(self, instance_id: str) -> dict[str, Any] | None:
        slot = self._placement.get(instance_id)
        if slot is None:
            return None
        return {"actor": slot, **(self._hosts[slot] or {"pid": None, "node_id": None, "node_ip": None})}

    def stats(self) -> dict[str, Any]:
        return {"backend": self.name, "actors": len(self._actors), "loads": list(self._loads),
                "actor_pids": [h["pid"] if h else None for h in self._hosts],
                "actor_nodes": [h["node_id"] if h else None for h in self._hosts],
                "replacements": self.replacements}


def placement_options(settings: RaySettings) -> dict[str, Any]:
    """Ray's placement of an env actor. With `node_labels`: a node with those labels (Ray's label selector),
    and when none can take it, say after that node's loss, any other node (the selector's fallback). Else
    SPREAD over the nodes, or Ray's default."""
    if settings.node_labels:
        wanted = dict(settings.node_labels)
        others = {key: f"!{value}" for key, value in wanted.items()}
        return {"label_selector": wanted, "fallback_strategy": [{"label_selector": others}]}
    return {"scheduling_strategy": "SPREAD" if settings.placement == "spread" else "DEFAULT"}
