"""Environment profiles: entities, their attributes and operations, and task preferences.

The JSON shape is AgentEvolver's (`cookbook/env_profiles/<env>.json`)::

    {"name": "...", "background": "...",
     "entities": [{"name": "...", "description": "...", "attrs": {"attr": "description"},
                   "opts": [{"name": "...", "description": "..."}]}],
     "task_preference": {"num_entities": 2, "num_opts": 3, "relation_difficulty": 2},
     "rubrics": [...]}

An operation may also carry `"template"`: a sentence with `{argument}` slots that the hindsight
synthesizer uses to write queries (e.g. "book flight {flight_id} for passenger {passenger_id}"), and
`"natural_template"`: the same request without ids, `{argument.field}` slots naming fields of the records
the ids identify (e.g. "book the {flight_id.airline} flight ... for {passenger_id.name}").
An operation that reads values may carry `"lookups"`: questions answered by a field of the records its
calls return, in the `ids` and `names` query forms (see `Lookup`), for the lookup synthesizer. A profile
may list `"tasks"`: multi-call task kinds (see `TaskKind`), for the multi-call synthesizer.
A profile is read from such a file, or derived from the environment service's profile and tool
docs (tools without an entity are gathered under one entity named after the environment).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.config import ConfigError

# A slot naming one change's argument, `{book_ticket.flight_id}`: (change, argument).
CHANGE_SLOT = re.compile(r"\{([A-Za-z_]\w*)\.([A-Za-z_]\w*)\}")


class _Lenient(BaseModel):
    # Profiles are hand-written JSON from other projects: keep unknown keys rather than reject them.
    model_config = ConfigDict(extra="allow")


class LookupForm(_Lenient):
    """One query form of a lookup. Slots name a field of the selected record or an argument of the call
    that returned it, optionally through a filter: `{date|day}` ("June 3, 2025") or a glossary of the
    profile (`{origin|place}` -> "San Francisco (SFO)")."""

    query: str = Field(description="the question, with `{field}` slots (`{field|filter}` to reword a value)")
    call: dict[str, str]  # the reference call's arguments (slots as in `query`); the tool is the operation
    # Fields whose values must single the record out among the records of its observation (an `each` lookup
    # describes the record by them, e.g. airline and departure time, rather than by its id).
    unique: list[str] = Field(default_factory=list, description=(
        "fields whose values must single the record out among those its call returned (an `each` lookup "
        "that describes the record by them rather than by its id)"))


class Lookup(_Lenient):
    """A question a read operation answers, e.g. a flight's fare or a passenger's travel credit.

    `select`: `each` record of an observation, or the one record with the `min`/`max` value of `of`
    (default: the answer field), a tie meaning no question; `where`: fields that must be positive (seats
    left) for a record to count."""

    kind: str = Field(min_length=1)  # named like the environment's own tasks of that sort (fare_lookup)
    answer: str = Field(min_length=1)  # the record field whose value answers
    select: Literal["each", "min", "max"] = Field(default="each", description=(
        "each: a question about every record a call returned; min/max: about the one record with the "
        "smallest/largest `of` (a tie: no question)"))
    of: str | None = Field(default=None, description="the field min/max compares (default: `answer`)")
    where: list[str] = Field(default_factory=list, description="fields that must be positive for a record to count")
    forms: dict[Literal["ids", "names"], LookupForm] = Field(min_length=1, description=(
        "the question in the `ids` form (the call's own argument values) and/or the `names` form (written as "
        "the environment's own tasks are); task_manager.synthesis.query_forms picks which"))


class Operation(_Lenient):
    """A tool of the environment (its name is the tool's name)."""

    name: str
    description: str = ""
    template: str | None = Field(default=None, description=(
        "how a hindsight goal reached by this call is worded, `{argument}` slots (book flight {flight_id})"))
    # The same request without ids: slots `{argument.field}` name a field of the record the argument's value
    # identifies (`{passenger_id.name}`), and may hop on (`{order_id.flight_id.origin}`).
    natural_template: str | None = Field(default=None, description=(
        "the same request without ids: `{argument.field}` names a field of the record the argument identifies"))
    lookups: list[Lookup] = Field(default_factory=list, description=(
        "for a read-only tool: the questions a field of the records it returns answers (kinds: [goal, lookup])"))


class Entity(_Lenient):
    """Something the environment holds (a flight, a book), its attributes and the operations on it."""

    name: str
    description: str = ""
    attrs: dict[str, str] = Field(default_factory=dict, description="attribute name -> what it holds")
    opts: list[Operation] = Field(default_factory=list, description="the operations (tools) on it")


class TaskPreference(_Lenient):
    """What an LLM synthesizer is asked for: how many entities and operations a task involves."""

    num_entities: int = Field(default=1, ge=1)
    num_opts: int = Field(default=2, ge=1)
    relation_difficulty: int = Field(default=2, ge=1, le=3, description=(
        "1 simple, independent steps; 2 moderately related; 3 tightly dependent"))


class CallTemplate(_Lenient):
    """One call of a multi-call task's reference: the tool, and its arguments as slots (`{flight.flight_id}`)."""

    name: str = Field(min_length=1)
    arguments: dict[str, str] = Field(default_factory=dict)


class TaskForm(_Lenient):
    """One query form of a multi-call task: the query and the reference calls, both written with slots that
    name an observed change's argument or result field (`{book_ticket.passenger_id}`) or a field of a bound
    record (`{flight.origin}`), optionally through a filter (`{flight.date|day}`, `{flight.origin|place}`, or
    one of the profile's `patterns`)."""

    query: str
    calls: list[CallTemplate] = Field(min_length=1)


class RecordBinding(_Lenient):
    """A record a multi-call task is about, found among what the observed read calls returned: a record of an
    `operation`'s result whose fields equal `match` (slots filled as in a form). With `select` min/max it must
    also be the one record with the least/greatest `of` among the records of its observation that share its
    `among` fields and have every `where` field positive (the cheapest flight of a route and date)."""

    operation: str = Field(min_length=1)
    match: dict[str, str] = Field(min_length=1)
    select: Literal["each", "min", "max"] = "each"
    of: str | None = None
    where: list[str] = Field(default_factory=list)
    among: list[str] = Field(default_factory=list)
    # A `match` field whose value is a change's argument (`{book_ticket.flight_id}`) that the task may choose:
    # where the observed change acted on another record of the group (a booking of some flight of a search), the
    # task is that change moved onto the selected record (the search's cheapest), and its expected state is what
    # the moved change reaches when replayed.
    choose: str | None = None

    @model_validator(mode="after")
    def _compared(self) -> RecordBinding:
        if self.select != "each" and not self.of:
            raise ValueError(f"a record binding with select {self.select!r} needs `of`: the field compared")
        if self.choose is not None and (self.select == "each"
                                        or not CHANGE_SLOT.fullmatch(self.match.get(self.choose, ""))):
            raise ValueError(f"a record binding's `choose` ({self.choose!r}) must be a `match` field whose value is one "
                             "slot naming a change's argument ({book_ticket.flight_id}), with select min or max")
        return self


class TaskKind(_Lenient):
    """A multi-call task the environment asks (book the cheapest flight, cancel a booking, rebook), for the
    multi-call synthesizer: the state-changing calls it is made of (`changes`, in order, as observed), the
    records its query describes (`records`, name -> binding), conditions between slots (`same`, `differ`: pairs
    of slot names whose values must be equal / different), and its query forms (`ids`, `names`)."""

    kind: str = Field(min_length=1)  # named like the environment's own tasks of that sort (book_by_id)
    tier: int | None = None
    changes: list[str] = Field(min_length=1)
    records: dict[str, RecordBinding] = Field(default_factory=dict)
    same: list[tuple[str, str]] = Field(default_factory=list)
    differ: list[tuple[str, str]] = Field(default_factory=list)
    forms: dict[Literal["ids", "names"], TaskForm] = Field(min_length=1)


class EnvProfile(_Lenient):
    """An environment's profile. Unknown keys are kept (profiles come from other projects too)."""

    name: str = Field(description="the environment's name")
    background: str = Field(default="", description="one paragraph: what the environment is")
    entities: list[Entity] = Field(default_factory=list)
    task_preference: TaskPreference = Field(default_factory=TaskPreference)
    rubrics: list[Any] = Field(default_factory=list, description="AgentEvolver's; kept, not used")
    glossary: dict[str, dict[str, str]] = Field(default_factory=dict, description=(
        "filter name -> value -> how a query writes it: `{origin|place}` writes SFO as San Francisco (SFO)"))
    patterns: dict[str, str] = Field(default_factory=dict, description=(
        "filter name -> a regular expression: `{slot|name}` writes its first group (`number`: UA123-0603 as UA123)"))
    tasks: list[TaskKind] = Field(default_factory=list, description=(
        "multi-call task kinds (book the cheapest flight, cancel, rebook), for the multi-call synthesizer"))

    def operations(self) -> dict[str, Operation]:
        return {op.name: op for entity in self.entities for op in entity.opts}

    def instruction(self) -> str:
        """The profile as text for an LLM explorer: what exists and what can be done to it."""
        lines = [f"# Environment: {self.name}"]
        if self.background:
            lines.append(self.background)
        lines.append("## Entities")
        for entity in self.entities:
            lines.append(f"- {entity.name}: {entity.description}")
            for attr, description in entity.attrs.items():
                lines.append(f"  - attribute {attr}: {description}")
            for op in entity.opts:
                lines.append(f"  - operation {op.name}: {op.description}")
        tiers = getattr(self, "tiers", None)  # an extra key: what the environment's task tiers ask
        if isinstance(tiers, dict) and tiers:
            lines.append("## Task tiers")
            lines += [f"- tier {tier}: {text}" for tier, text in tiers.items()]
        return "\n".join(lines)

    def preference_instruction(self) -> str:
        pref = self.task_preference
        difficulty = {1: "simple, independent", 2: "moderately related", 3: "tightly dependent"}[pref.relation_difficulty]
        return (f"Each task should involve about {pref.num_entities} entities and {pref.num_opts} operations, "
                f"with {difficulty} steps (later steps use what earlier steps returned).")


def load_profile_file(path: str | Path) -> EnvProfile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"task_manager.profiles: profile file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"task_manager.profiles: {path} is not valid JSON: {exc}") from None
    try:
        return EnvProfile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"task_manager.profiles: {path} is not an environment profile "
                          f"(AgentEvolver's shape: name, background, entities, task_preference): {exc}") from None


def tool_name(doc: dict[str, Any]) -> str:
    return str((doc.get("function") or doc).get("name", ""))


def tool_function(doc: dict[str, Any]) -> dict[str, Any]:
    """The function part of an OpenAI tool schema (`{"type": "function", "function": {...}}` or bare)."""
    return doc.get("function") or doc


MAX_STRING = 60  # characters of a free string argument: a call must finish within the role's token budget

# (argument name, its JSON schema) -> the values allowed for it; empty: none known.
ValueChoices = Callable[[str, dict[str, Any]], list[Any]]


def call_schema(tools: list[dict[str, Any]], choices: ValueChoices | None = None,
                require_known: bool = False) -> dict[str, Any]:
    """JSON schema of one call of a documented tool: `{"name": <a tool>, "arguments": <its parameters>}`.

    Used for structured outputs, so that a small model can only write calls the environment accepts:
    documented arguments only, free strings bounded. `choices` grounds argument values: an argument with
    known values must take one of them (a JSON-schema `enum`); with `require_known`, an argument without
    any is dropped, and a tool whose required argument has none is left out (its call could not replay).
    """
    options = []
    for doc in tools:
        fn = tool_function(doc)
        if not fn.get("name"):
            continue
        parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        required = list(parameters.get("required") or [])
        properties: dict[str, Any] | None = {}
        for argument, schema in (parameters.get("properties") or {}).items():
            values = choices(argument, schema or {}) if choices else []
            if values:
                properties[argument] = {"enum": values}
            elif not require_known:
                properties[argument] = _bounded(schema or {})
            elif argument in required:
                properties = None
                break
        if properties is None or (require_known and not properties):
            continue
        arguments = {**parameters, "type": "object", "properties": properties,
                     "required": [a for a in required if a in properties], "additionalProperties": False}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": arguments},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise ValueError("no documented tool to build a call schema from")
    return options[0] if len(options) == 1 else {"anyOf": options}


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    if schema.get("type") == "string" and not ({"enum", "const", "pattern", "maxLength"} & set(schema)):
        return {**schema, "maxLength": MAX_STRING}
    return schema


def profile_from_env(env_type: str, env_profile: dict[str, Any] | None, tool_docs: list[dict[str, Any]]) -> EnvProfile:
    """The environment's own profile, completed with an operation for every documented tool."""
    data = dict(env_profile or {})
    data.setdefault("name", env_type)
    try:
        profile = EnvProfile.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"the environment service's profile of {env_type!r} has the wrong shape: {exc}") from None
    known = profile.operations()
    missing = [doc for doc in tool_docs if tool_name(doc) and tool_name(doc) not in known]
    if missing:
        profile.entities.append(Entity(
            name=env_type, description=f"the tools of {env_type}",
            opts=[Operation(name=tool_name(d), description=str(tool_function(d).get("description", "")))
                  for d in missing]))
    return profile
