"""Explicit two-phase exploration in real environment instances.

Breadth phase: N_b steps at a high temperature, steered towards operations and entities of the
profile not visited yet. Depth phase: N_d steps at a lower temperature, conditioned on the last k
observations (their values and what they make possible). After every step the state snapshot
is taken, so each state actually reached can later become a goal (hindsight synthesis).

Two explorers share this loop: `RandomExplorer` (no LLM: samples well-formed calls from the
tool docs, the profile and values seen in observations) and `LLMExplorer` (a chat role).

An environment without tool docs (the gym adapter, text games) is explored through its action schema
instead (`action_schema`): a discrete list of action words, the operations its profile names (the gym
adapter lists each game's actions), sent as the assistant message itself; else the commands the state
snapshot lists as `valid_actions` at each step (TextWorld's admissible commands); or, with neither, free
text, which only the LLM explorer can write.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.generated_ids import learned
from common.llm import LLMClient, json_schema_format
from task_manager.envs import EnvAccess
from task_manager.models import Call, Exploration, ExploreStep
from task_manager.profile import EnvProfile, call_schema, tool_function, tool_name
from task_manager.values import ValuePool, known_values


@dataclass
class ExploreConfig:
    breadth_steps: int = 6
    depth_steps: int = 10
    window: int = 3  # k: observations the depth phase conditions on
    breadth_temperature: float = 1.0
    depth_temperature: float = 0.4


@dataclass
class ExplorerView:
    """What an explorer may look at when choosing its next action."""

    profile: EnvProfile
    tools: list[dict[str, Any]]
    initial_messages: list[dict[str, Any]]
    steps: list[ExploreStep]
    phase: str
    temperature: float
    window: int
    pool: ValuePool = field(default_factory=ValuePool)
    actions: list[str] = field(default_factory=list)  # discrete action words, for an env without tool docs

    def recent(self) -> list[ExploreStep]:
        return self.steps[-self.window:] if self.window else []


class Explorer(Protocol):
    name: str

    async def act(self, view: ExplorerView) -> tuple[str, list[Call]]:
        """The next assistant message, and the calls it makes when the explorer knows them."""


def action_schema(profile: EnvProfile, seed_task_id: str) -> list[str]:
    """The discrete actions of an environment without tool docs: the operations of the profile's entity
    that the task belongs to (the gym adapter names an entity per game, and a task id starts with the
    game's id), else every operation of the profile. Empty: the actions are free text."""
    entities = [e for e in profile.entities if e.opts]
    own = [e for e in entities if seed_task_id.startswith(f"{e.name}/")]
    chosen = own[:1] or entities
    return list(dict.fromkeys(op.name for entity in chosen for op in entity.opts))


def published_actions(snapshot: Any) -> list[str]:
    """The commands a state snapshot lists as valid now (`valid_actions`, a text game's admissible commands)."""
    actions = snapshot.get("valid_actions") if isinstance(snapshot, dict) else None
    if not isinstance(actions, list):
        return []
    return [a for a in actions if isinstance(a, str) and a.strip()]


def softmax_choice(rng: random.Random, options: list[Any], scores: list[float], temperature: float) -> Any:
    t = max(temperature, 1e-3)
    top = max(scores)
    weights = [math.exp((s - top) / t) for s in scores]
    return rng.choices(options, weights=weights, k=1)[0]


class RandomExplorer:
    """Samples well-formed calls: every required argument filled, with a value of the right type."""

    name = "random"

    def __init__(self, rng: random.Random, optional_probability: float = 0.5) -> None:
        self.rng = rng
        self.optional_probability = optional_probability

    async def act(self, view: ExplorerView) -> tuple[str, list[Call]]:
        if view.actions and not view.tools:
            return self.choose_action(view)
        refused = {c.key() for s in view.steps if s.failed for c in s.calls}
        call = self.sample(view)
        for _ in range(5):  # a call the environment already refused teaches nothing new
            if call.key() not in refused:
                break
            call = self.sample(view)
        return call.render(), [call]

    def choose_action(self, view: ExplorerView) -> tuple[str, list[Call]]:
        """One action word: breadth favours actions not taken yet, depth ones that changed the state."""
        visits: dict[str, int] = {}
        changed: dict[str, int] = {}
        for step in view.steps:
            for call in step.calls:
                visits[call.name] = visits.get(call.name, 0) + 1
                changed[call.name] = changed.get(call.name, 0) + int(step.state_changed)
        if view.phase == "depth":
            scores = [0.5 * changed.get(a, 0) - 0.1 * visits.get(a, 0) for a in view.actions]
        else:
            scores = [-1.0 * visits.get(a, 0) for a in view.actions]
        action = softmax_choice(self.rng, view.actions, scores, view.temperature)
        return action, [Call(name=action)]

    def sample(self, view: ExplorerView) -> Call:
        functions = [tool_function(doc) for doc in view.tools if tool_name(doc)]
        if not functions:
            raise ValueError("the environment documents no tools, its profile names no operations (a discrete "
                             "action list) and its state lists no valid_actions: its actions are free text, which "
                             "the random explorer cannot write; use the LLM explorer (task_manager.llm.explorer)")
        depth = view.phase == "depth"
        since = view.steps[-view.window].index if depth and len(view.steps) >= view.window > 0 else (0 if depth else None)
        visits: dict[str, int] = {}
        changed: dict[str, int] = {}
        for step in view.steps:
            for call in step.calls:
                visits[call.name] = visits.get(call.name, 0) + 1
                if step.state_changed:
                    changed[call.name] = changed.get(call.name, 0) + 1
        profiled = set(view.profile.operations())
        scores = []
        for fn in functions:
            name = fn["name"]
            fillable = self._fillable(fn, view.pool, since if depth else None)
            if depth:
                # Go deeper: operations the recent observations make possible, and ones that never changed state yet.
                score = 1.0 * fillable + (0.5 if not changed.get(name) else 0.0) - 0.2 * visits.get(name, 0)
            else:
                # Go wide: operations of the profile not visited yet.
                score = -1.0 * visits.get(name, 0) + (0.5 if name in profiled else 0.0) + 0.3 * fillable
            scores.append(score)
        fn = softmax_choice(self.rng, functions, scores, view.temperature)
        return Call(name=fn["name"], arguments=self._arguments(fn, view.pool, since if depth else None))

    @staticmethod
    def _fillable(fn: dict[str, Any], pool: ValuePool, since: int | None) -> float:
        params = (fn.get("parameters") or {}).get("properties") or {}
        required = (fn.get("parameters") or {}).get("required") or []
        if not required:
            return 0.5
        known = sum(1 for arg in required if arg in pool.by_key and
                    (since is None or pool.candidates(arg, params.get(arg, {}).get("description", ""), since)))
        return known / len(required)

    def _arguments(self, fn: dict[str, Any], pool: ValuePool, since: int | None) -> dict[str, Any]:
        parameters = fn.get("parameters") or {}
        properties: dict[str, Any] = parameters.get("properties") or {}
        required = set(parameters.get("required") or [])
        chosen = [arg for arg in properties if arg in required or self.rng.random() < self.optional_probability]
        if not chosen and properties:
            chosen = [self.rng.choice(list(properties))]  # a call with no argument at all teaches nothing
        return {arg: self._value(arg, properties[arg] or {}, pool, since) for arg in chosen}

    def _value(self, arg: str, schema: dict[str, Any], pool: ValuePool, since: int | None) -> Any:
        kind = schema.get("type", "string")
        if "enum" in schema and schema["enum"]:
            return self.rng.choice(list(schema["enum"]))
        if kind == "boolean":
            return self.rng.random() < 0.5
        description = str(schema.get("description", ""))
        candidates: list[Any] = []
        if since is not None and self.rng.random() < 0.8:
            candidates = pool.candidates(arg, description, since)
        if not candidates:
            candidates = pool.candidates(arg, description)
        if kind in ("integer", "number"):
            numeric = [c for c in candidates if isinstance(c, (int, float)) and not isinstance(c, bool)]
            lo, hi = schema.get("minimum", 0), schema.get("maximum", 10)
            value = self.rng.choice(numeric) if numeric else self.rng.uniform(lo, hi)
            return int(value) if kind == "integer" else float(value)
        if kind == "array":
            item = self._value(arg, schema.get("items") or {}, pool, since)
            return [item]
        if kind == "object":
            return {}
        strings = [str(c) for c in candidates if not isinstance(c, bool)]
        salient = [c for c in strings if c in pool.salient]
        if salient and self.rng.random() < 0.6:
            strings = salient  # the request's own values go together (its route, its passenger)
        return self.rng.choice(strings) if strings else f"{arg}_1"


class ObservedExplorer:
    """Plays back an agent's own tool calls, in order: the exploration is what the agent did. An id the agent's
    run generated (an order number it then cancelled) is another value in this fresh instance: learned from the
    agent's `results` and this run's observations so far, by the replay's rule (`common.generated_ids`), so
    the later calls name this run's ids."""

    name = "observed"

    def __init__(self, calls: list[Call], results: list[str] | None = None) -> None:
        self.calls, self.results = list(calls), list(results or [])

    async def act(self, view: ExplorerView) -> tuple[str, list[Call]]:
        call = self.calls[len(view.steps)]
        remapper = learned(self.results, [s.observation for s in view.steps])
        if remapper.mapping:
            call = Call(name=call.name, arguments={k: remapper.apply(v) if isinstance(v, str) else v
                                                   for k, v in call.arguments.items()})
        return call.render(), [call]


async def observed_exploration(access: EnvAccess, profile: EnvProfile, env_type: str, seed_task_id: str,
                               calls: list[Call], results: list[str]) -> Exploration:
    """An agent's tool calls as an exploration: replayed in a fresh instance of the seed task for the states they
    reach and whether they fail, each step the agent's own call and the result its own tool gave (so the steps
    name the agent's run's ids throughout, as a recorded run does)."""
    config = ExploreConfig(breadth_steps=len(calls), depth_steps=0)
    exploration = await explore_episode(access, ObservedExplorer(calls, results), profile, env_type, seed_task_id,
                                        config)
    for step, call, result in zip(exploration.steps, calls, results, strict=False):
        step.action, step.calls, step.observation = call.render(), [call], result
    return exploration


class LLMExplorer:
    """An LLM role explores: the profile and tools in the system prompt, the phase decides the instructions."""

    name = "llm"

    def __init__(self, llm: LLMClient, max_tokens: int = 128) -> None:
        self.llm, self.max_tokens = llm, max_tokens

    async def act(self, view: ExplorerView) -> tuple[str, list[Call]]:
        messages = self.messages(view)
        if not view.tools:  # an action word or free text: the reply is the action
            result = await self.llm.chat(messages, temperature=view.temperature, max_tokens=self.max_tokens)
            text = result.text.strip() or "(no action)"
            named = [a for a in view.actions if re.search(rf"\b{re.escape(a)}\b", text, re.IGNORECASE)]
            return (named[0], [Call(name=named[0])]) if len(named) == 1 else (text, [])
        text = ""
        # Where the endpoint has structured outputs, the reply is one call of a documented tool, its arguments
        # drawn from the values met so far (the request, the docs' examples, observations) where there are
        # any, as the random explorer draws them: SmolLM2 left free invents arguments and ids.
        tried = {c.name for s in view.steps for c in s.calls}
        untried = [d for d in view.tools if tool_name(d) and tool_name(d) not in tried]
        # The breadth phase is for operations not tried yet: while some are left, only they can be called.
        tools = untried if view.phase == "breadth" and untried else view.tools
        response_format = json_schema_format("tool_call", call_schema(
            tools, lambda argument, schema: known_values(view.pool, argument, schema)))
        done = {c.key() for s in view.steps if not s.failed for c in s.calls}
        for attempt in range(2):
            result = await self.llm.chat(messages, temperature=view.temperature, max_tokens=self.max_tokens,
                                         response_format=response_format)
            text = result.text.strip()
            call = _structured_call(text) if result.structured else None
            if call is not None:
                if call.key() in done and attempt == 0:
                    # The same successful call again teaches nothing new: ask once for another.
                    messages = [*messages, {"role": "assistant", "content": text},
                                {"role": "user", "content": "You already made exactly this call. Make a different "
                                                            "call that uses what the observations returned."}]
                    continue
                return call.render(), [call]
            # A reply naming no tool would end a tool environment's episode: ask once more.
            if _names_in(text, view.tools):
                break
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": "That calls no tool. Reply with one tool call only."}]
        return text or "(no action)", []

    @staticmethod
    def messages(view: ExplorerView) -> list[dict[str, Any]]:
        tools = "\n".join(f"- {tool_function(d)['name']}({', '.join((tool_function(d).get('parameters') or {}).get('properties', {}))})"
                          f": {tool_function(d).get('description', '')}" for d in view.tools if tool_name(d))
        tried = sorted({c.name for s in view.steps for c in s.calls} |
                       {t for s in view.steps for t in _names_in(s.action, view.tools)})
        if view.phase == "breadth":
            phase = ("PHASE 1, breadth: try operations and entities you have not tried yet, to learn what exists. "
                     f"Already tried: {', '.join(tried) or 'nothing'}.")
        else:
            phase = ("PHASE 2, depth: build on the last observations: use the ids and values they returned to go "
                     "further (change things, follow up on results).")
        if view.tools:
            how = (f"## Tools\n{tools}\n{phase}\nReply with exactly one tool call such as "
                   '<tool_call>{"name": "tool", "arguments": {"arg": "value"}}</tool_call> and nothing else.')
        elif view.actions:
            how = f"## Actions\n{', '.join(view.actions)}\n{phase}\nReply with exactly one action and nothing else."
        else:
            how = f"{phase}\nReply with the one thing you do next, as a short command, and nothing else."
        system = f"You are exploring an environment to discover what can be done in it.\n{view.profile.instruction()}\n{how}"
        context = next((m.get("content", "") for m in view.initial_messages if m.get("role") == "user"), "")
        messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                          {"role": "user", "content": f"Situation: {context}\nStart exploring."}]
        for step in view.recent() if view.phase == "depth" else view.steps[-2 * max(view.window, 1):]:
            messages.append({"role": "assistant", "content": step.action})
            messages.append({"role": "user", "content": f"Observation: {step.observation[:1500]}"})
        return messages


def _structured_call(text: str) -> Call | None:
    """The call in a schema-constrained reply; None when it was cut off (the token limit) or is not a call."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(data.get("arguments"), dict):
        return None
    return Call(name=data["name"], arguments=data["arguments"])


def _names_in(text: str, tools: list[dict[str, Any]]) -> list[str]:
    return [tool_name(d) for d in tools if tool_name(d) and tool_name(d) in text]


def opening_pool(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> ValuePool:
    """The values an episode knows before its first call: the tool docs' examples and the opening messages (the
    user's request parsed as a request: its route, its dates, its names)."""
    pool = ValuePool()
    for doc in tools:
        for schema in ((tool_function(doc).get("parameters") or {}).get("properties") or {}).values():
            pool.harvest(str(schema.get("description", "")), -1)
    for message in messages:
        if message.get("role") == "user":
            pool.harvest_request(str(message.get("content") or ""))
        else:
            pool.harvest(str(message.get("content") or ""), -1)
    return pool


async def argument_values(access: EnvAccess, env_type: str, seed_task_id: str) -> dict[str, dict[str, list[Any]]]:
    """Per tool and argument, the values an episode of the seed task knows at its start (`known_values`): what a
    forced exploration call may take, so that a model that writes no sensible argument still calls with one."""
    tools = await access.tool_docs(env_type, seed_task_id)
    async with access.instance(env_type, seed_task_id) as instance:
        pool = opening_pool(tools, instance.messages)
    out: dict[str, dict[str, list[Any]]] = {}
    from_request: set[str] = set()  # tools whose required arguments all take values of the request
    for doc in tools:
        fn = tool_function(doc)
        if not fn.get("name"):
            continue
        parameters = fn.get("parameters") or {}
        properties = parameters.get("properties") or {}
        # The request's own values alone where it has some (its route, its passenger): a model choosing among them
        # and the tool docs' examples took the examples (measured with SmolLM2 on flights).
        found = {}
        for arg, schema in properties.items():
            values = known_values(pool, arg, schema or {})
            salient = [v for v in values if v in pool.salient]
            if values:
                found[arg] = salient or values
        if not found:
            continue
        out[fn["name"]] = found
        required = parameters.get("required") or []
        if all(any(v in pool.salient for v in found.get(arg, [])) for arg in required) and (
                required or any(v in pool.salient for values in found.values() for v in values)):
            from_request.add(fn["name"])
    # Only the tools the request can fill, where some can: a call on a doc example's passenger is only refused.
    return {name: found for name, found in out.items() if name in from_request} if from_request else out


async def explore_episode(access: EnvAccess, explorer: Explorer, profile: EnvProfile, env_type: str,
                          seed_task_id: str, config: ExploreConfig) -> Exploration:
    """Run one exploration episode in a fresh instance of `seed_task_id`."""
    tools = await access.tool_docs(env_type, seed_task_id)
    listed = [] if tools else action_schema(profile, seed_task_id)
    async with access.instance(env_type, seed_task_id) as instance:
        pool = opening_pool(tools, instance.messages)
        initial = await instance.snapshot()
        exploration = Exploration(env_type=env_type, seed_task_id=seed_task_id, explorer=explorer.name,
                                  initial_messages=instance.messages, initial_state=initial)
        previous = access.comparable(initial)
        snapshot = initial
        phases = ["breadth"] * config.breadth_steps + ["depth"] * config.depth_steps
        for index, phase in enumerate(phases):
            temperature = config.breadth_temperature if phase == "breadth" else config.depth_temperature
            actions = listed or ([] if tools else published_actions(snapshot))
            view = ExplorerView(profile, tools, instance.messages, exploration.steps, phase, temperature,
                                config.window, pool, actions)
            action, calls = await explorer.act(view)
            outcome = await instance.step(action)
            snapshot = await instance.snapshot()
            current = access.comparable(snapshot)
            changed = snapshot is not None and current != previous
            exploration.steps.append(ExploreStep(index=index, phase=phase, action=action, calls=calls,  # type: ignore[arg-type]
                                                 observation=outcome.observation, failed=outcome.failed,
                                                 state=snapshot, state_changed=changed))
            pool.harvest(outcome.observation, index)
            previous = current
            error = outcome.info.get("error")
            if isinstance(error, dict) and error.get("code") == "environment_error":
                exploration.environment_error = exploration.environment_error or str(error.get("message"))
            if outcome.done:
                break
    return exploration


def exploration_text(exploration: Exploration, max_chars: int = 600) -> str:
    """Action/observation pairs for a synthesizer prompt; the seed task's own messages are never included."""
    parts = []
    for step in exploration.steps:
        parts.append(f">>> STEP {step.index} <<<\n<|ACTION|>\n{step.action}\n<|END|>\n"
                     f"<|OBSERVATION|>\n{step.observation[:max_chars]}\n<|END|>")
    return "\n".join(parts)
