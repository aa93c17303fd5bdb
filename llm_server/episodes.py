"""The gateway's episodes: what each agent call sampled, kept per episode, and the rule for weight updates.

An episode is opened by the caller (the agent runner), receives the agent's chat calls, and is ended by the
caller, which then reads its record. Its calls are recorded token for token (`GatewayCall`).

Continuing calls. An agent sends its whole history on every call, and that history holds the gateway's
earlier replies re-rendered from JSON (tool arguments re-serialised, the chat template's own layout), so
its rendered prompt almost never contains the ids that were sampled. The gateway issues tool-call ids it
recognises (`call_<episode nonce>_<call>_<position>`); when the last assistant message of a call is the
reply of an earlier call of the episode, unchanged, and everything before it is exactly the messages that
call was sent, the new call continues that call's own context: its prompt ids, its sampled ids, then the
template's rendering of what came after (`glue_ids`). The model then continues what it really produced, and
the calls merge into one trajectory. Any other history (the agent rewrote, summarised or dropped turns)
is rendered as sent: that call trains as its own transition.

Scripted episodes. A script's replies are a reference's, recorded in another run: an id that run's tools
generated (an order number) is another value in this one. Given the reference's results (`script_results`),
each reply's generated ids are carried over to the ones this episode's tool results show, by the task manager's
replay rule (`common.generated_ids`), so that a booking's cancel names the order this run booked.

Weight updates. An episode samples from one policy version: a weight update waits until every open episode
has ended, and episodes opened while it waits start after it. An episode still open after
`gateway_drain_timeout_s` is cut (`ended_reason: weight_update`; its later calls get 409) so that a stuck
agent cannot hold the trainer forever; the runner fails cut episodes, it never trains them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from common.generated_ids import learned
from common.service import ServiceError
from llm_server.protocol import (
    EpisodeMode,
    EpisodeOpen,
    EpisodeRecord,
    EpisodeSampling,
    GatewayCall,
    ObservedToolResult,
)

EXP_OPEN, EXP_CLOSE = "<EXP>", "</EXP>"  # the markers in-loop rollouts use (trainer.templates)


def with_experience(messages: list[dict[str, Any]], experience: str) -> list[dict[str, Any]]:
    """The messages with the experience at the head of the system message (a new one when there is none)."""
    out = [dict(m) for m in messages]
    block = f"{EXP_OPEN}\n{experience.strip()}\n{EXP_CLOSE}"
    if out and out[0].get("role") in ("system", "developer"):
        out[0]["content"] = f"{block}\n\n{_text(out[0].get('content'))}"
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def _text(content: Any) -> str:
    """A message's text: a string, or OpenAI content parts joined."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def canonical(message: dict[str, Any], *, with_name: bool = True) -> dict[str, Any]:
    """What of a message changes its rendering: SDKs add empty fields (`refusal`, `annotations`) and
    re-serialise tool arguments, which must not count as a rewrite."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append([call.get("id") if isinstance(call, dict) else None, function.get("name"),
                      _arguments(function.get("arguments"))])
    role = message.get("role")
    out = {"role": "system" if role == "developer" else role, "content": _text(message.get("content")).strip(),
           "tool_calls": calls, "tool_call_id": message.get("tool_call_id")}
    if with_name:
        out["name"] = message.get("name")
    return out


def same_tools(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> bool:
    return json.dumps(a or [], sort_keys=True) == json.dumps(b or [], sort_keys=True)


@dataclass
class Episode:
    episode_id: str
    experience: str | None
    metadata: dict[str, Any]
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    calls: list[GatewayCall] = field(default_factory=list)
    issued: dict[str, int] = field(default_factory=dict)  # tool-call id -> the call that issued it
    next_index: int = 0
    ended_reason: str | None = None
    mode: EpisodeMode = "policy"
    script: list[str] = field(default_factory=list)  # a scripted episode's replies, in order
    script_results: list[str] = field(default_factory=list)  # what the script's tool calls returned when recorded
    tool_arguments: dict[str, dict[str, list[Any]]] = field(default_factory=dict)  # a forced call's values
    sampling: EpisodeSampling | None = None  # applied to every call, whatever the agent asks

    def start_call(self) -> int:
        index, self.next_index = self.next_index, self.next_index + 1
        return index

    def call_ids(self, index: int) -> Callable[[int], str]:
        return lambda position: f"call_{self.nonce}_{index}_{position}"

    def add(self, call: GatewayCall) -> None:
        self.calls.append(call)
        self.calls.sort(key=lambda c: c.index)
        self.issued.update({c["id"]: call.index for c in call.tool_calls})

    def continued(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                  ) -> tuple[GatewayCall, int] | None:
        """The earlier call this call's history continues unchanged, and the position of its reply."""
        last = next((j for j in range(len(messages) - 1, -1, -1) if messages[j].get("role") == "assistant"), None)
        if last is None:
            return None
        reply = messages[last]
        ids = [c.get("id") for c in reply.get("tool_calls") or [] if isinstance(c, dict)]
        if ids:
            indexes = {self.issued.get(i) for i in ids}
            candidates = [self.calls_by_index[i] for i in indexes if i is not None and i in self.calls_by_index]
            if len(indexes) != 1 or not candidates:
                return None
        else:  # a plain text reply: the latest call sent the same history and replied the same text
            candidates = [c for c in reversed(self.calls) if len(c.messages) == last and not c.tool_calls]
        sent = canonical(reply, with_name=False)
        history = [canonical(m) for m in messages[:last]]
        for call in candidates:
            issued = {"role": "assistant", "content": call.content, "tool_calls": call.tool_calls}
            if (canonical(issued, with_name=False) == sent and same_tools(call.tools, tools)
                    and [canonical(m) for m in call.messages] == history):
                return call, last
        return None

    @property
    def calls_by_index(self) -> dict[int, GatewayCall]:
        return {c.index: c for c in self.calls}

    def observed(self, messages: list[dict[str, Any]] | None = None) -> list[ObservedToolResult]:
        """Each tool call the episode's replies made whose result the agent sent back in a later call (or in
        `messages`, a call not yet recorded)."""
        results: dict[str, str] = {}
        for sent in [*(call.messages for call in self.calls), messages or []]:
            for message in sent:
                if message.get("role") == "tool" and isinstance(message.get("tool_call_id"), str):
                    results.setdefault(message["tool_call_id"], _text(message.get("content")))
        return [ObservedToolResult(call_index=call.index, tool_call_id=issued["id"], name=issued["function"]["name"],
                                   arguments=_arguments(issued["function"].get("arguments")),
                                   result=results[issued["id"]])
                for call in self.calls for issued in call.tool_calls if issued.get("id") in results]

    def scripted_reply(self, index: int, messages: list[dict[str, Any]]) -> str:
        """The script's reply `index`, its generated ids those of this run: learned from the recorded results and
        the results the agent's tools returned so far, in order."""
        reply = self.script[index]
        if not self.script_results:
            return reply
        return learned(self.script_results, [o.result for o in self.observed(messages)]).apply(reply)

    def record(self) -> EpisodeRecord:
        return EpisodeRecord(episode_id=self.episode_id, status="open" if self.ended_reason is None else "ended",
                             ended_reason=self.ended_reason, with_experience=self.experience is not None,
                             mode=self.mode, sampling=self.sampling, observed=self.observed(), metadata=self.metadata, calls=list(self.calls))


@dataclass
class GatewayCounters:
    opened: int = 0
    ended: int = 0
    cut_by_weight_update: int = 0
    calls: int = 0
    continued_calls: int = 0  # calls whose context continued an earlier call's sampled ids
    late_calls: int = 0  # calls that finished after their episode ended: answered 409, not recorded
    forced_calls: int = 0  # calls of forced-tools (exploration) episodes: off-policy
    scripted_calls: int = 0  # calls of scripted episodes (a reference played through the agent): off-policy


class EpisodeRegistry:
    """Open episodes, the records of the last `keep_records` ended ones, the ids of the last `keep_ids` (so a late
    call is a 409, not a 404), and the swap rule. Records hold every call's ids: they are read once, at the end."""

    def __init__(self, drain_timeout_s: float, keep_records: int = 256, keep_ids: int = 65536) -> None:
        self.drain_timeout_s, self.keep_records, self.keep_ids = drain_timeout_s, keep_records, keep_ids
        self.open: dict[str, Episode] = {}
        self.ended: OrderedDict[str, Episode] = OrderedDict()
        self.forgotten: OrderedDict[str, str] = OrderedDict()  # ended episodes whose record is dropped -> reason
        self.counters = GatewayCounters()
        self._changed = asyncio.Condition()
        self._swapping = False
        self._one_swap = asyncio.Lock()

    async def open_episode(self, request: EpisodeOpen) -> Episode:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._swapping)  # it starts on the new weights
            episode_id = request.episode_id or f"ep-{uuid.uuid4().hex[:16]}"
            if episode_id in self.open or episode_id in self.ended or episode_id in self.forgotten:
                raise ServiceError(409, "episode_exists", f"episode {episode_id!r} already exists; open it under "
                                                          "a new episode_id or leave episode_id out")
            mode: EpisodeMode = "forced" if request.force_tools else "scripted" if request.script else "policy"
            episode = Episode(episode_id, request.experience, dict(request.metadata), mode=mode,
                              script=list(request.script or []), script_results=list(request.script_results or []),
                              tool_arguments=dict(request.tool_arguments or {}), sampling=request.sampling)
            self.open[episode_id] = episode
            self.counters.opened += 1
            return episode

    def find(self, episode_id: str) -> Episode:
        episode = self.open.get(episode_id) or self.ended.get(episode_id)
        if episode is None and episode_id in self.forgotten:
            raise ServiceError(410, "episode_record_dropped", f"episode {episode_id!r} ended "
                                                              f"({self.forgotten[episode_id]}) and its record is no "
                                                              f"longer kept (the last {self.keep_records} are): read "
                                                              "it when ending the episode",
                               {"ended_reason": self.forgotten[episode_id]})
        if episode is None:
            raise ServiceError(404, "episode_not_found", f"no episode {episode_id!r} on this gateway: open one "
                                                         "with POST /v1/episodes first")
        return episode

    def for_call(self, episode_id: str) -> Episode:
        reason = self.forgotten.get(episode_id)
        episode = self.find(episode_id) if reason is None else None
        reason = reason or (episode.ended_reason if episode is not None else None)
        if reason is not None:
            raise ServiceError(409, "episode_ended", f"episode {episode_id!r} has ended ({reason}); its calls are "
                                                     "closed", {"ended_reason": reason})
        assert episode is not None
        return episode

    def record_call(self, episode: Episode, call: GatewayCall) -> None:
        if episode.ended_reason is not None:
            self.counters.late_calls += 1
            raise ServiceError(409, "episode_ended", f"episode {episode.episode_id!r} ended while this call was "
                                                     "sampled; the call is not recorded",
                               {"ended_reason": episode.ended_reason})
        episode.add(call)
        self.counters.calls += 1
        self.counters.continued_calls += call.extends is not None
        self.counters.forced_calls += episode.mode == "forced"
        self.counters.scripted_calls += episode.mode == "scripted"

    async def end(self, episode_id: str, reason: str = "ended") -> Episode:
        episode = self.find(episode_id)
        async with self._changed:
            if episode.ended_reason is None:
                self._end(episode, reason)
            self._changed.notify_all()
        return episode

    def _end(self, episode: Episode, reason: str) -> None:
        episode.ended_reason = reason
        self.open.pop(episode.episode_id, None)
        self.ended[episode.episode_id] = episode
        while len(self.ended) > self.keep_records:
            old_id, old = self.ended.popitem(last=False)
            self.forgotten[old_id] = old.ended_reason or "ended"
        while len(self.forgotten) > self.keep_ids:
            self.forgotten.popitem(last=False)
        self.counters.ended += 1
        self.counters.cut_by_weight_update += reason == "weight_update"

    @asynccontextmanager
    async def weight_swap(self) -> AsyncIterator[None]:
        """Hold new episodes, wait for the open ones to end (cut them after the drain timeout), swap, release."""
        async with self._one_swap:
            async with self.draining():
                yield

    @asynccontextmanager
    async def draining(self) -> AsyncIterator[None]:
        async with self._changed:
            self._swapping = True
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: not self.open), self.drain_timeout_s)
            except asyncio.TimeoutError:
                stuck = list(self.open.values())
                # The update stalled this long: the log names the episodes (an agent or a caller that never ended them).
                logger.warning("weight update waited gateway_drain_timeout_s={} s; cutting {} open episode(s): {}",
                               self.drain_timeout_s, len(stuck), ", ".join(e.episode_id for e in stuck[:8]))
                for episode in stuck:
                    self._end(episode, "weight_update")
        try:
            yield
        finally:
            async with self._changed:
                self._swapping = False
                self._changed.notify_all()

    def stats(self) -> dict[str, int]:
        return {"open_episodes": len(self.open), "weight_update_waiting": self._swapping, **vars(self.counters)}
