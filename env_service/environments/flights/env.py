"""The `flights` environment: a booking desk with tools, hidden preconditions and exact grading."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from typing import Any

from common.actions import ActionParseError, ParsedCall, parse_actions
from common.answers import answer_alone, answer_correct
from common.schemas import ChatMessage, Split
from env_service.environments.base import SPLITS, EnvInstance, Environment, EvalResult, StepResult
from env_service.environments.flights.desk import TOOL_SPECS, FlightDesk, ToolError, tool_docs
from env_service.environments.flights.tasks import (
    ORDER_REF,
    TIER_KINDS,
    FlightTask,
    Question,
    TaskGenerator,
    questions,
)
from env_service.environments.flights.world import (
    AIRPORTS,
    DATES,
    World,
    generate_task_world,
    generate_world,
    split_dates,
)


def _parameters(name: str) -> tuple[str, ...] | None:
    """A tool's parameters in its doc's order: names positional arguments (`search_flight('SFO', 'JFK')`)."""
    spec = TOOL_SPECS.get(name)
    return tuple(spec[1]) if spec is not None else None


DEFAULT_SPLITS: dict[str, int] = {"train": 240, "validation": 40, "test": 80}
# Which splits' questions a split may not ask again. Validation keeps its tasks (numbers measured on it stay
# comparable); test asks nothing validation asks (settings are chosen on validation); train asks nothing
# either held-out split asks.
EXCLUDED_SPLITS: dict[str, tuple[str, ...]] = {"validation": (), "test": ("validation",),
                                               "train": ("validation", "test")}

SYSTEM_PROMPT = """You are a travel agent at an airline booking desk. Help the user by calling tools.
Tools: {signatures}.
Airports: {airports}. Flights are sold for {first} to {last}.
Call tools as Python, e.g. search_flight(origin='SFO', destination='JFK', date='{example_date}'), several per
message if you like, or as <tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call> blocks.
When the request is done (or cannot be done), reply in plain text without a tool call; that ends the conversation."""


# `prompt_example: true`: one worked exchange in the system prompt. The passenger is made up (no task can
# ask about them), so the example shows the call format and the closing reply without leaking an answer.
PROMPT_EXAMPLE = """
Example:
User: How much travel credit does Zoe Park have?
Assistant: get_passenger(name='Zoe Park')
Tool: {"passenger_id": "P0999", "name": "Zoe Park", "tier": "basic", "travel_credit": 900}
Assistant: Zoe Park has 900 USD of travel credit."""


def _signature(name: str) -> str:
    params = TOOL_SPECS[name][1]
    return f"{name}({', '.join(arg if required else arg + '=None' for arg, (_, required, _) in params.items())})"


def _tier_weights(value: Any) -> dict[int, float]:
    """`tiers: [1, 2, 3]` (equal shares) or `tiers: {1: 0.5, 2: 0.25, 3: 0.25}` (shares of each split)."""
    if isinstance(value, list):
        value = {t: 1.0 for t in value}
    if not isinstance(value, dict) or not value:
        raise ValueError("flights tiers must be a non-empty list of tiers (e.g. [1, 2, 3]) or a mapping "
                         "tier -> share (e.g. {1: 0.5, 2: 0.5})")
    weights: dict[int, float] = {}
    for tier, share in value.items():
        if str(tier) not in {str(t) for t in TIER_KINDS}:
            raise ValueError(f"flights tiers: unknown tier {tier!r}; tiers are {', '.join(map(str, TIER_KINDS))}")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or share <= 0:
            raise ValueError(f"flights tiers: the share of tier {tier} must be a positive number, got {share!r}")
        weights[int(tier)] = float(share)
    return dict(sorted(weights.items()))


def _tier_counts(size: int, weights: dict[int, float]) -> dict[int, int]:
    """A split's size shared out by weight (largest remainder, so the counts add up to `size`)."""
    total = sum(weights.values())
    exact = {t: size * w / total for t, w in weights.items()}
    counts = {t: int(x) for t, x in exact.items()}
    for t in sorted(exact, key=lambda t: (-(exact[t] - counts[t]), t))[: size - sum(counts.values())]:
        counts[t] += 1
    return counts


class FlightsEnvironment(Environment):
    name = "flights"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        known = {"version", "grading", "seed", "routes", "splits", "max_steps", "tiers", "prompt_example"}
        unknown = sorted(set(self.config) - known)
        if unknown:
            raise ValueError(f"unknown flights config key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        self.version = self.config.get("version", 1)
        if self.version not in (1, 2):
            raise ValueError(f"flights version must be 1 (one world shared by every task) or 2 (a world per task, "
                             f"disjoint names and dates per split), got {self.version!r}")
        # v1 keeps the grader its recorded results were measured with; v2 grades strictly.
        self.grading = self.config.get("grading", "strict" if self.version == 2 else "lenient")
        if self.grading not in ("strict", "lenient"):
            raise ValueError(f"flights grading must be 'strict' (the reply states the expected value and no other "
                             f"value of its sort) or 'lenient' (no value the task names as wrong), got {self.grading!r}")
        self.seed = int(self.config.get("seed", 7))
        self.max_steps = int(self.config.get("max_steps", 30))
        sizes = {**DEFAULT_SPLITS, **self.config.get("splits", {})}
        if set(sizes) != set(SPLITS):
            raise ValueError(f"flights splits must be {', '.join(SPLITS)}, got {', '.join(sizes)}")
        self.split_sizes = {s: int(n) for s, n in sizes.items()}
        # Without `tiers` the ids and tasks are the original ones (`train-0007`, all tier 3), so existing
        # configs and their recorded results keep their meaning; with it ids carry the tier (`train-t1-0007`).
        self.tier_weights = _tier_weights(self.config["tiers"]) if "tiers" in self.config else None
        self.tier_counts = ({s: _tier_counts(n, self.tier_weights) for s, n in self.split_sizes.items()}
                            if self.tier_weights else None)
        self.routes = int(self.config.get("routes", 36 if self.version == 1 else 12))
        # v1: the one world every task shares; v2: None, each task carries its own (`FlightTask.world`).
        self.world: World | None = generate_world(self.seed, self.routes) if self.version == 1 else None
        self.generator = TaskGenerator(self.world, self.seed) if self.world is not None else None
        self._tasks: dict[str, FlightTask] = {}
        self._asked: dict[str, frozenset[Question]] = {}  # per split: the questions its tasks ask
        self._expected: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._prompts: dict[tuple[str, ...], str] = {}
        # v1's prompt; in v2 the train split's (a task's own is `system_prompt_for`: its split's dates).
        self.system_prompt = self._prompt(DATES if self.version == 1 else split_dates("train"))
        # A train kind whose every question is held out fails here, as a config error, not at its first task.
        for tier, count in (self.tier_counts or {}).get("train", {}).items():
            for index in range(min(count, len(TIER_KINDS[tier]))):
                self.task(f"train-t{tier}-{index:04d}")

    def _prompt(self, dates: tuple[str, ...]) -> str:
        prompt = self._prompts.get(dates)
        if prompt is None:
            prompt = SYSTEM_PROMPT.format(signatures=", ".join(_signature(n) for n in TOOL_SPECS),
                                          airports=", ".join(AIRPORTS), first=dates[0], last=dates[-1],
                                          example_date=dates[1])
            if self.config.get("prompt_example", False):
                prompt += PROMPT_EXAMPLE
            self._prompts[dates] = prompt
        return prompt

    def world_of(self, task: FlightTask) -> World:
        world = task.world or self.world
        assert world is not None
        return world

    def system_prompt_for(self, task: FlightTask) -> str:
        return self._prompt(self.world_of(task).dates)

    # ------------------------------------------------------------ tasks

    def task_ids(self, split: Split) -> list[str]:
        if self.tier_counts is None:
            return [f"{split}-{i:04d}" for i in range(self.split_sizes[split])]
        counts = self.tier_counts[split]
        # Interleaved in proportion, so that the first N ids of a split have the configured mix.
        order = sorted(((i + 0.5) / n, tier, i) for tier, n in counts.items() for i in range(n))
        return [f"{split}-t{tier}-{i:04d}" for _, tier, i in order]

    def task(self, task_id: str) -> FlightTask:
        task = self._tasks.get(task_id)
        if task is not None:
            return task
        split, tier, index = self._parse_id(task_id)
        if self.generator is not None:
            task = self.generator.generate(split, index, tier, self._excluded(split))
        else:
            # Seeded by the task id: the same task is the same world wherever and whenever it is created.
            world = generate_task_world(f"{self.seed}:{task_id}", split, self.routes)
            task = replace(TaskGenerator(world, self.seed).generate(split, index, tier), world=world)
        with self._lock:
            self._tasks[task_id] = task
        return task

    def asked(self, split: Split) -> frozenset[Question]:
        """Every question (`tasks.questions`) the split's tasks ask."""
        asked = self._asked.get(split)
        if asked is None:
            asked = frozenset().union(*(questions(self.task(i)) for i in self.task_ids(split)))
            self._asked[split] = asked  # deterministic: two threads computing it get the same set
        return asked

    def _excluded(self, split: str) -> frozenset[Question]:
        key = f"excluded:{split}"
        excluded = self._asked.get(key)
        if excluded is None:
            excluded = frozenset().union(*(self.asked(s) for s in EXCLUDED_SPLITS.get(split, ())))
            self._asked[key] = excluded
        return excluded

    def _parse_id(self, task_id: str) -> tuple[str, int | None, int]:
        parts = task_id.split("-")
        split, index = parts[0], parts[-1]
        tier = int(parts[1][1:]) if len(parts) == 3 and parts[1][:1] == "t" and parts[1][1:].isdigit() else None
        if self.tier_counts is None:
            valid = len(parts) == 2 and split in self.split_sizes and index.isdigit() \
                and int(index) < self.split_sizes[split] and task_id == f"{split}-{int(index):04d}"
            if not valid:
                raise KeyError(f"no flights task {task_id!r}; ids look like train-0000 (sizes: {self.split_sizes})")
            return split, None, int(index)
        counts = self.tier_counts.get(split, {})
        valid = tier is not None and tier in counts and index.isdigit() and int(index) < counts[tier] \
            and task_id == f"{split}-t{tier}-{int(index):04d}"
        if not valid:
            raise KeyError(f"no flights task {task_id!r}; ids look like train-t1-0000 (tasks per split and "
                           f"tier: {self.tier_counts})")
        return split, tier, int(index)

    def create(self, task_id: str, params: dict[str, Any] | None = None) -> FlightsInstance:
        task = self.task(task_id)
        params = params or {}
        query = params.get("query")
        if query is not None and (not isinstance(query, str) or not query.strip()):
            raise ValueError("params.query must be a non-empty string")
        max_steps = params.get("max_steps", self.max_steps)
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError("params.max_steps must be a positive integer")
        return FlightsInstance(self, task, query, max_steps)

    def expected_state(self, task: FlightTask) -> dict[str, Any]:
        """The comparable state after the reference solution (cached per task)."""
        expected = self._expected.get(task.task_id)
        if expected is None:
            desk = self.fresh_desk(task)
            for name, arguments in task.reference:
                desk.call(name, resolve_order_refs(desk, arguments))
            expected = desk.comparable()
            with self._lock:
                self._expected[task.task_id] = expected
        return expected

    def fresh_desk(self, task: FlightTask) -> FlightDesk:
        desk = FlightDesk(self.world_of(task))
        for passenger_id, flight_id in task.preload:
            desk.preload_order(passenger_id, flight_id)
        return desk

    # ------------------------------------------------------------ descriptions

    def tool_docs(self, task_id: str | None = None) -> list[dict[str, Any]]:
        if task_id is not None:
            self.task(task_id)  # KeyError for an unknown task, like create
        return tool_docs()

    def profile(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "background": "An airline booking desk: search flights, look up passengers, book, list and cancel "
                          "orders, paid from each passenger's travel credit.",
            "entities": [
                {"name": "flight", "description": "a scheduled flight on one route and date",
                 "attrs": {"flight_id": "airline code, number and date", "origin": "IATA code",
                           "destination": "IATA code", "date": "YYYY-MM-DD", "depart": "HH:MM", "arrive": "HH:MM",
                           "stops": "0 or 1", "price": "USD", "seats_left": "seats still for sale"},
                 "opts": [{"name": "search_flight", "description": TOOL_SPECS["search_flight"][0]}]},
                {"name": "passenger", "description": "a traveller with an id and travel credit",
                 "attrs": {"passenger_id": "e.g. P1001", "name": "full name", "tier": "basic/silver/gold",
                           "travel_credit": "USD available for fares"},
                 "opts": [{"name": "get_passenger", "description": TOOL_SPECS["get_passenger"][0]}]},
                {"name": "order", "description": "a seat booked for a passenger on a flight",
                 "attrs": {"order_id": "generated id", "passenger_id": "who flies", "flight_id": "which flight",
                           "price": "USD paid", "status": "active or cancelled"},
                 "opts": [{"name": n, "description": TOOL_SPECS[n][0]}
                          for n in ("book_ticket", "cancel_order", "list_orders")]},
            ],
            "task_preference": {"num_entities": 2, "num_opts": 3, "relation_difficulty": 3},
            # What each tier asks, so that a task synthesizer can write tasks of every tier.
            "tiers": {
                "1": "one call, answered in text: the cheapest fare of a route and date (search_flight), a "
                     "passenger's travel credit or id (get_passenger by name); the reply states the value",
                "2": "two calls, ids given: book the cheapest flight of a route and date for a passenger id "
                     "(search_flight, book_ticket); cancel a passenger id's booking (list_orders, cancel_order)",
                "3": "three to five calls, passengers named: book the cheapest flight, possibly under a "
                     "constraint (nonstop, airline, time); cancel one of several bookings; rebook onto "
                     "another date",
            },
        }

    def capabilities(self) -> dict[str, bool]:
        # Not deterministic: order ids carry a random salt, so a replayed cancel_order names an order that the
        # fresh instance does not have. A fork copies the desk, ids included.
        return {"fork": True, "deterministic": False}

    def info(self) -> dict[str, Any]:
        world = {"flights": len(self.world.flights), "passengers": len(self.world.passengers)} if self.world else \
            {"world": "one per task", "routes_per_world": self.routes}
        return {**super().info(), "tools": list(TOOL_SPECS), "version": self.version, "grading": self.grading,
                "seed": self.seed, **world,
                "tiers": {s: {str(t): n for t, n in c.items()} for s, c in self.tier_counts.items()}
                if self.tier_counts else None}

    def reference_episode(self, task_id: str) -> list[ChatMessage] | None:
        """The reference's calls (as the `<tool_call>` blocks the task manager's references write) and a closing
        reply ("The answer is X." for a lookup), each stepped in a fresh instance; order ids are this run's."""
        task = self.task(task_id)
        instance = self.create(task_id)
        messages = instance.reset()
        for name, arguments in task.reference:
            call = json.dumps({"name": name, "arguments": resolve_order_refs(instance.desk, arguments)})
            action = ChatMessage(role="assistant", content=f"<tool_call>{call}</tool_call>")
            messages += [action, instance.step(action).observation]
        closing = ChatMessage(role="assistant",
                              content=f"The answer is {task.answer}." if task.answer is not None else "Done.")
        instance.step(closing)
        if instance.evaluate().score != 1.0:
            raise RuntimeError(f"the reference of flights task {task_id} does not solve it")
        return [*messages, closing]


def resolve_order_refs(desk: FlightDesk, arguments: dict[str, Any]) -> dict[str, Any]:
    """Replace "$order:<passenger>:<flight>" placeholders by that active order's generated id."""
    resolved = {}
    for key, value in arguments.items():
        if isinstance(value, str) and value.startswith(ORDER_REF):
            passenger_id, flight_id = value[len(ORDER_REF):].split(":")
            value = next(o.order_id for o in desk.orders.values()
                         if o.passenger_id == passenger_id and o.flight_id == flight_id and o.status == "active")
        resolved[key] = value
    return resolved


class FlightsInstance(EnvInstance):
    def __init__(self, env: FlightsEnvironment, task: FlightTask, query: str | None, max_steps: int) -> None:
        self.env, self.task, self.max_steps = env, task, max_steps
        self.query = query or task.query
        self.query_replaced = query is not None
        self.desk = env.fresh_desk(task)
        self.steps = 0
        self.done = False
        self.reply: str | None = None  # the closing plain-text reply: a tier-1 task's answer

    def reset(self) -> list[ChatMessage]:
        self.desk = self.env.fresh_desk(self.task)
        self.steps, self.done, self.reply = 0, False, None
        return [ChatMessage(role="system", content=self.env.system_prompt_for(self.task)),
                ChatMessage(role="user", content=self.query)]

    def step(self, action: ChatMessage) -> StepResult:
        if self.done:
            return StepResult(observation=ChatMessage(role="user", content="The conversation is over."), done=True,
                              info={"error": "episode_finished"})
        self.steps += 1
        try:
            calls = parse_actions(action, _parameters)
        except ActionParseError as exc:
            return self._limit(StepResult(observation=ChatMessage(
                role="tool", content=f"Error: could not parse your tool call: {exc}"), info={"error": "parse_error"}))
        if not calls:
            self.done = True
            self.reply = action.text()
            score = self.evaluate().score
            return StepResult(observation=ChatMessage(role="user", content="Thank you, that is all."),
                              reward=score, done=True, info={"finished": "agent_reply"})
        results = [self._run(call) for call in calls]
        if len(calls) == 1:
            content = results[0]
        else:
            content = "\n".join(f"[{i}] {call.to_python()} -> {text}"
                                for i, (call, text) in enumerate(zip(calls, results, strict=True), 1))
        call_id = calls[0].call_id if len(calls) == 1 else None
        observation = ChatMessage(role="tool", content=content, tool_call_id=call_id,
                                  name=calls[0].name if len(calls) == 1 else None)
        return self._limit(StepResult(observation=observation, info={"calls": [c.name for c in calls]}))

    def _run(self, call: ParsedCall) -> str:
        try:
            return json.dumps(self.desk.call(call.name, call.arguments))
        except ToolError as exc:
            return f"Error: {exc}"

    def _limit(self, result: StepResult) -> StepResult:
        if self.steps >= self.max_steps and not result.done:
            self.done = True
            result.done = True
            result.reward = self.evaluate().score
            result.info["finished"] = "max_steps"
        return result

    def evaluate(self, params: dict[str, Any] | None = None) -> EvalResult:
        expected = self.env.expected_state(self.task)
        actual = self.desk.comparable()
        info: dict[str, Any] = {"kind": self.task.kind, "tier": self.task.tier}
        if self.query_replaced:
            info["note"] = "the query was replaced; this grades the original task"
        answered = True
        if self.task.answer is not None:
            if self.env.grading == "strict":
                answered = self.reply is not None and answer_alone(self.reply, self.task.answer)
            else:
                answered = self.reply is not None and answer_correct(self.reply, self.task.answer,
                                                                     self.task.wrong_answers)
            info["answer_correct"] = answered
            if self.reply is None:
                info["note"] = "no closing text reply: this task is answered in text"
        if actual == expected and answered:
            return EvalResult(score=1.0, info=info)
        expected_orders = {tuple(o.values()) for o in expected["orders"]}
        actual_orders = {tuple(o.values()) for o in actual["orders"]}
        info["missing_orders"] = sorted(expected_orders - actual_orders)
        info["unexpected_orders"] = sorted(actual_orders - expected_orders)
        return EvalResult(score=0.0, info=info)

    def state(self) -> dict[str, Any]:
        return {"task_id": self.task.task_id, **self.desk.snapshot()}

    def fork(self) -> FlightsInstance:
        twin = FlightsInstance(self.env, self.task, self.query if self.query_replaced else None, self.max_steps)
        twin.desk = self.desk.copy()
        twin.steps, twin.done, twin.reply = self.steps, self.done, self.reply
        return twin

    def state_hash(self) -> str:
        canonical = json.dumps(self.desk.comparable(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

