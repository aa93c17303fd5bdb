"""Task synthesizers: turn an exploration into proposed tasks `{query, confidence, reference actions}`.

- `HindsightSynthesizer` (no LLM, the default): every state the exploration actually reached
  becomes a goal. Its reference is the shortest sub-sequence of the exploration's successful
  actions found to reach that state again in a fresh instance (state-changing actions first,
  then the read actions they turn out to depend on, such as the search a booking needs). The
  query is written from the profile's operations and the reference's arguments.
- `LLMSynthesizer`: an LLM reads the exploration (the seed task's own query masked) and the
  task preferences and writes `<task>{"query", "confidence", "action_sequence"}</task>` blocks.
  Each block becomes its own new `Proposal` object: AgentEvolver mutated one shared task per
  exploration, so every parsed task ended up with the last block's query and reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from common.llm import LLMClient, json_schema_format
from task_manager.envs import EnvAccess
from task_manager.explore import exploration_text
from task_manager.models import Call, Exploration, ExploreStep, Proposal, canonical_hash
from task_manager.profile import EnvProfile, call_schema, tool_name
from task_manager.replay import replay
from task_manager.values import ValuePool, known_values

GENERATED = "<generated>"


@dataclass
class SynthesisStats:
    proposed: int = 0  # tasks the synthesizer put forward (goals tried / <task> blocks written)
    parsed: int = 0  # proposals that came out well-formed


def signature(proposal: Proposal) -> str:
    """The reference's operation sequence, with generated ids abstracted: equal for the same task.

    A `names` query of a reference is another task than its `ids` query (the agent must look the ids up)."""
    generated = set(proposal.generated)
    if proposal.calls is not None:
        ops = [[c.name, {k: (GENERATED if str(v) in generated else v) for k, v in sorted(c.arguments.items())}]
               for c in proposal.calls]
    else:
        ops = [re.sub(r"\s+", " ", _mask(a, generated)).strip() for a in proposal.actions]
    if proposal.lookup is not None:  # the same call answers several questions (a fare, a seat count)
        return canonical_hash([proposal.env_type, ops[:1], "lookup", proposal.lookup.kind, proposal.query_form,
                               proposal.lookup.identity, proposal.lookup.answer], size=24)
    if proposal.query_form == "names":
        return canonical_hash([proposal.env_type, ops, "names"], size=24)
    return canonical_hash([proposal.env_type, ops], size=24)


def _mask(text: str, generated: set[str]) -> str:
    for value in sorted(generated, key=len, reverse=True):
        text = text.replace(value, GENERATED)
    return text


# ---------------------------------------------------------------- hindsight


class HindsightSynthesizer:
    name = "hindsight"

    def __init__(self, access: EnvAccess, profile: EnvProfile, max_goals: int = 4, max_repairs: int = 4,
                 query_forms: tuple[str, ...] = ("ids",)) -> None:
        self.access, self.profile = access, profile
        self.max_goals, self.max_repairs = max_goals, max_repairs
        self.query_forms = tuple(query_forms)

    async def propose(self, exploration: Exploration) -> tuple[list[Proposal], SynthesisStats]:
        stats = SynthesisStats()
        if exploration.initial_state is None:
            return [], stats  # no verifiable state: nothing to take as a goal
        goals = [s for s in exploration.steps if s.state_changed and not s.failed]
        # Deepest goals first: they need the most calls; keep the earlier ones while there is room.
        chosen = sorted(goals, key=lambda s: -s.index)[: self.max_goals]
        proposals = []
        for goal_step in sorted(chosen, key=lambda s: s.index):
            stats.proposed += 1
            found = await self._minimal(exploration, goal_step)
            if found is None:
                continue
            proposal, sequence = found
            stats.parsed += 1
            if "ids" in self.query_forms:
                proposals.append(proposal)
            if "names" in self.query_forms:
                # Only where every id of the request can be described by what the exploration saw.
                seen = [exploration.initial_state] + [_json(s.observation) for s in exploration.steps[: goal_step.index + 1]
                                                      if not s.failed]
                changing = [c for s in sequence if s.state_changed for c in s.calls]
                natural = write_natural_query(self.profile, changing, seen) if changing else None
                if natural is not None:
                    proposals.append(proposal.model_copy(update={"query": natural, "query_form": "names"}))
        return proposals, stats

    async def _minimal(self, exploration: Exploration,
                       goal_step: ExploreStep) -> tuple[Proposal, list[ExploreStep]] | None:
        successful = [s for s in exploration.steps[: goal_step.index + 1] if not s.failed]
        goal = self.access.comparable(goal_step.state)
        chosen = {s.index for s in successful if s.state_changed}
        for _ in range(self.max_repairs + 1):
            sequence = [s for s in successful if s.index in chosen]
            result = await self._replay(exploration, sequence)
            if result.ok and self.access.comparable(result.end_state) == goal:
                return self._proposal(exploration, sequence, goal, result.generated), sequence
            if result.ok or result.failed_at is None:
                break
            needed = self._dependency(successful, chosen, sequence[result.failed_at], result.error)
            if needed is None:
                break
            chosen.add(needed.index)
        # Fall back to every successful action up to the goal: that is how the state was reached.
        result = await self._replay(exploration, successful)
        if result.ok and self.access.comparable(result.end_state) == goal:
            return self._proposal(exploration, successful, goal, result.generated), successful
        return None

    async def _replay(self, exploration: Exploration, sequence: list[ExploreStep]):
        return await replay(self.access, exploration.env_type, exploration.seed_task_id,
                            [s.action for s in sequence], recorded_initial_state=exploration.initial_state,
                            recorded_observations=[s.observation for s in sequence])

    @staticmethod
    def _dependency(successful: list[ExploreStep], chosen: set[int], failing: ExploreStep,
                    error: str) -> ExploreStep | None:
        """The read action a failing action most likely depends on.

        Scored by what the refusal names ("search SFO -> JFK on 2025-06-04 first" names the search
        and its arguments) and by whether the step's observation holds one of the failing call's
        argument values; ties go to the latest step.
        """
        earlier = [s for s in successful if s.index < failing.index and s.index not in chosen]
        if not earlier:
            return None
        error_words = _words(error)
        values = [str(v) for c in failing.calls for v in c.arguments.values() if str(v)]

        def score(step: ExploreStep) -> tuple[float, int]:
            named = len(error_words & _words(step.action))
            mentions = any(v in step.observation for v in values)
            return (2.0 * named + (1.0 if mentions else 0.0), step.index)

        return max(earlier, key=score)

    def _proposal(self, exploration: Exploration, sequence: list[ExploreStep], goal: Any,
                  generated: set[str]) -> Proposal:
        calls = [c for s in sequence for c in s.calls] if all(s.calls for s in sequence) else None
        query = write_query(self.profile, sequence, generated, exploration.initial_state)
        return Proposal(query=query, confidence=1.0, actions=[s.action for s in sequence], calls=calls,
                        observations=[s.observation for s in sequence],
                        recorded_initial_state=exploration.initial_state, goal_state=goal,
                        generated=sorted(generated), synthesizer=self.name, env_type=exploration.env_type,
                        seed_task_id=exploration.seed_task_id, exploration_id=exploration.exploration_id)


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z0-9\-]{3,}", (text or "").replace("_", " "))} - {"error", "the"}


def write_query(profile: EnvProfile, sequence: list[ExploreStep], generated: set[str], initial_state: Any) -> str:
    """A request naming what the state-changing actions did, from the profile's operations.

    Read actions are left for the agent to find; a generated id is described by the record it
    came from ("the order with passenger_id P1003 and flight_id UA123-0603"), since a fresh
    instance generates a different one.
    """
    operations = profile.operations()
    records = [initial_state] + [_json(s.observation) for s in sequence]
    sentences = []
    for step in sequence:
        if not step.state_changed:
            continue
        for call in step.calls or []:
            values = {k: (_describe(k, v, records, generated) if str(v) in generated else v)
                      for k, v in call.arguments.items()}
            op = operations.get(call.name)
            if op is None and not operations and not call.arguments:
                sentences.append(call.name)  # a text game's command ("take coin") is its own request
                continue
            if op is not None and op.template:
                try:
                    sentences.append(op.template.format(**values))
                    continue
                except (KeyError, IndexError, ValueError):
                    pass
            what = _first_clause(op.description if op else "") or f"use {call.name}"
            args = ", ".join(f"{k} {v}" for k, v in values.items())
            sentences.append(f"{what} ({args})" if args else what)
        if not step.calls:
            sentences.append(f"do what this request does: {step.action.strip()[:200]}")
    if not sentences:
        return ""
    text = sentences[0][0].upper() + sentences[0][1:]
    for sentence in sentences[1:]:
        text += f". Then {sentence[0].lower()}{sentence[1:]}"
    return text + "."


_SLOT = re.compile(r"\{([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)\}")


def write_natural_query(profile: EnvProfile, calls: list[Call], records: list[Any]) -> str | None:
    """The request of the state-changing `calls` in the environment's own words: every id replaced by what it
    identifies.

    Each call's operation needs a `natural_template`; a slot `{argument.field}` is filled from
    the record (in `records`: the initial state and the observations) whose `argument` equals the call's
    value; None when a template or a record is missing (the task then keeps only its id form).
    """
    operations = profile.operations()
    sentences = []
    for call in calls:
        op = operations.get(call.name)
        if op is None or not op.natural_template:
            return None
        try:
            sentence = _SLOT.sub(lambda m, args=call.arguments: _resolve(m.group(1), args, records),
                                 op.natural_template)
        except LookupError:
            return None
        if "{" in sentence:
            return None
        sentences.append(sentence)
    if not sentences:
        return None
    text = sentences[0][0].upper() + sentences[0][1:]
    for sentence in sentences[1:]:
        text += f". Then {sentence[0].lower()}{sentence[1:]}"
    return text + "."


def _resolve(path: str, arguments: dict[str, Any], records: list[Any]) -> str:
    """`argument.field[.field...]`: follow the argument's value to its record, then field by field."""
    key, *fields = path.split(".")
    if key not in arguments:
        raise LookupError(key)
    value: Any = arguments[key]
    for name in fields:
        record = next((r for source in records if (r := _record_with(source, key, value)) is not None
                       and name in r), None)
        if record is None:
            raise LookupError(f"{key}={value}")
        key, value = name, record[name]
    return str(value)


def _first_clause(description: str) -> str:
    clause = re.split(r"[.;]\s", description.strip() + " ", maxsplit=1)[0].strip().rstrip(".")
    return clause[:1].lower() + clause[1:] if clause else ""


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None


def _describe(key: str, value: Any, records: list[Any], generated: set[str]) -> str:
    """Name a generated value by the other fields of the record it appears in."""
    for record in records:
        found = _record_with(record, key, value)
        if found is not None:
            fields = [(k, v) for k, v in found.items() if k != key and isinstance(v, (str, int))
                      and str(v) not in generated and k.endswith("_id")]
            if fields:
                noun = key.removesuffix("_id").replace("_", " ") or key
                return f"the {noun} with " + " and ".join(f"{k} {v}" for k, v in fields[:2])
    return f"the {key} returned earlier"


def _record_with(data: Any, key: str, value: Any) -> dict | None:
    if isinstance(data, dict):
        if data.get(key) == value:
            return data
        data = list(data.values())
    if isinstance(data, list):
        for item in data:
            found = _record_with(item, key, value)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------- LLM


SYNTHESIS_SYSTEM = """# ROLE
You turn an agent's recorded tool interactions into realistic, verifiable user tasks.

For each task output exactly one block:
<task>
{"query": "a specific user request with concrete ids, names, dates", "confidence": 0.0-1.0,
 "action_sequence": ["tool_call(arg='value')", "another_call(arg='value')"]}
</task>

Rules: each task uses several different calls; action_sequence is the exact list of calls that
solves the task, one call per item, using only values seen in the record; leave out exploration
or failed steps; write different tasks, not rephrasings of one."""


def synthesis_messages(exploration: Exploration, profile: EnvProfile, old_queries: list[str],
                       max_chars: int = 400) -> list[dict[str, str]]:
    """The prompt: the exploration's action/observation pairs only; the seed task's query is masked."""
    old = "\n".join(f"- {q}" for q in old_queries[-10:]) or "(none yet)"
    user = (f"{profile.instruction()}\n\n# Seed task\nSystem and user messages: [MASKED]\n\n"
            f"# Record\n{exploration_text(exploration, max_chars)}\n\n"
            f"# Already written (do not repeat)\n{old}\n\n# Task requirements\n{profile.preference_instruction()}\n\n"
            "Write the tasks now.")
    return [{"role": "system", "content": SYNTHESIS_SYSTEM}, {"role": "user", "content": user}]


_TASK_BLOCK = re.compile(r"<task>(.*?)(?:</task>|$)", re.DOTALL)
_STEP_HEADER = re.compile(r"^\s*#\s*step\s*\d+\s*$", re.IGNORECASE | re.MULTILINE)


def parse_task_blocks(text: str) -> tuple[int, list[dict[str, Any]]]:
    """(number of tasks written, the well-formed ones as {query, confidence, actions}).

    Reads the schema-constrained answer (`{"tasks": [...]}`) or `<task>` blocks of free text.
    """
    try:
        whole = json.loads(text or "")
    except ValueError:
        whole = None
    if isinstance(whole, dict) and isinstance(whole.get("tasks"), list):
        items: list[Any] = whole["tasks"]
    elif (text or "").lstrip().startswith('{"tasks"'):
        items = _complete_objects(text)  # a constrained answer cut by the token limit: keep the finished tasks
    else:
        items = []
        for block in (b for b in _TASK_BLOCK.findall(text or "") if b.strip()):
            try:
                items.append(json.loads(_strip_fence(block)))
            except (ValueError, TypeError):
                items.append(None)
    parsed = [task for task in map(_task_item, items) if task is not None]
    return len(items), parsed


def _complete_objects(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    items = []
    for match in re.finditer(r'\{\s*"query"', text):
        try:
            items.append(decoder.raw_decode(text, match.start())[0])
        except ValueError:
            items.append(None)  # the task the limit cut: written, not well-formed
    return items


def _task_item(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    query = data.get("query")
    actions = split_actions(data.get("action_sequence"))
    try:
        confidence = float(data.get("confidence", 0.5))
    except (TypeError, ValueError):
        return None
    if isinstance(query, str) and query.strip() and actions:
        return {"query": query.strip(), "confidence": min(max(confidence, 0.0), 1.0), "actions": actions}
    return None


def task_schema(tools: list[dict[str, Any]], max_tasks: int = 2, call: dict[str, Any] | None = None,
                second: dict[str, Any] | None = None) -> dict[str, Any]:
    """The synthesizer's answer as JSON: 1..max_tasks tasks, each a query and 2-4 calls of documented tools
    (sized so that two tasks fit about 500 tokens). `call`: the schema of one call (default: any documented
    call); `second`: the schema the second call must meet (default: `call`)."""
    call = call or call_schema(tools)
    sequence: dict[str, Any] = {"type": "array", "minItems": 2, "maxItems": 4, "items": call}
    if second is not None:
        sequence["prefixItems"] = [call, second]
    task = {"type": "object", "properties": {
        "query": {"type": "string", "minLength": 10, "maxLength": 200},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "action_sequence": sequence},
        "required": ["query", "confidence", "action_sequence"], "additionalProperties": False}
    return {"type": "object", "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": max_tasks,
                                                       "items": task}},
            "required": ["tasks"], "additionalProperties": False}


def observed_values(exploration: Exploration) -> ValuePool:
    """The values the exploration actually met: fields of successful observations and the arguments of
    successful calls. Refusals are left out: they echo made-up values back ("no passenger with id 'P9'")."""
    pool = ValuePool()
    for step in exploration.steps:
        if step.failed:
            continue
        pool.harvest(step.observation, step.index)
        for call in step.calls:
            for key, value in call.arguments.items():
                if isinstance(value, (str, int, float, bool)):
                    pool.by_key.setdefault(key, {})[value] = step.index
    return pool


def grounded_call_schema(tools: list[dict[str, Any]], exploration: Exploration,
                         changing: bool = False) -> dict[str, Any] | None:
    """One call of a documented tool whose every argument takes a value the exploration observed, so that a
    small model can only write calls that may replay; None when no tool is left (nothing was observed).
    `changing`: only tools whose call changed the state in the exploration."""
    pool = observed_values(exploration)
    if changing:
        names = {c.name for s in exploration.steps if s.state_changed and not s.failed for c in s.calls}
        tools = [d for d in tools if tool_name(d) in names]
    try:
        return call_schema(tools, lambda argument, schema: known_values(pool, argument, schema), require_known=True)
    except ValueError:
        return None


def _strip_fence(block: str) -> str:
    block = block.strip()
    if block.startswith("```"):
        block = block.strip("`")
        block = block[block.find("{"):] if "{" in block else block
    return block


def split_actions(sequence: Any) -> list[str]:
    """An action_sequence as assistant messages: a list (strings or call objects) or one text."""
    if isinstance(sequence, list):
        out = []
        for item in sequence:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out.append(Call(name=item["name"], arguments=dict(item.get("arguments") or {})).render())
            elif isinstance(item, str) and item.strip():
                out.append(item.strip())
        return out
    if isinstance(sequence, str) and sequence.strip():
        segments = [s.strip() for s in _STEP_HEADER.split(sequence) if s.strip()]
        if len(segments) == 1:
            lines = [line.strip() for line in segments[0].splitlines() if line.strip()]
            if all("(" in line or "<tool_call>" in line for line in lines):
                return lines
        return segments
    return []


class LLMSynthesizer:
    name = "llm"

    def __init__(self, llm: LLMClient, profile: EnvProfile, max_tokens: int = 512, temperature: float = 0.7,
                 min_confidence: float = 0.0, grounded: bool = True) -> None:
        self.llm, self.profile, self.grounded = llm, profile, grounded
        self.max_tokens, self.temperature, self.min_confidence = max_tokens, temperature, min_confidence

    async def propose(self, exploration: Exploration, old_queries: list[str] | None = None,
                      tools: list[dict[str, Any]] | None = None) -> tuple[list[Proposal], SynthesisStats]:
        """`tools`: the environment's tool docs; given, the answer is schema-constrained where the endpoint can."""
        messages = synthesis_messages(exploration, self.profile, old_queries or [])
        response_format = None
        if tools:
            # Grounded in the exploration where it observed values; else any documented call.
            grounded = grounded_call_schema(tools, exploration) if self.grounded else None
            # Verification keeps only tasks that change the state: where the exploration changed it, the
            # second call is one of the tools that did (the first one sets it up, as a search before a booking).
            changing = grounded_call_schema(tools, exploration, changing=True) if grounded else None
            response_format = json_schema_format("tasks", task_schema(tools, call=grounded, second=changing))
        result = await self.llm.chat(messages, temperature=self.temperature, max_tokens=self.max_tokens,
                                     response_format=response_format)
        blocks, parsed = parse_task_blocks(result.text)
        stats = SynthesisStats(proposed=blocks, parsed=len(parsed))
        proposals = [
            # A new object per block (never a shared one mutated in a loop).
            Proposal(query=item["query"], confidence=item["confidence"], actions=list(item["actions"]),
                     recorded_initial_state=exploration.initial_state, synthesizer=self.name, query_form="free",
                     env_type=exploration.env_type, seed_task_id=exploration.seed_task_id,
                     exploration_id=exploration.exploration_id)
            for item in parsed if item["confidence"] >= self.min_confidence
        ]
        return proposals, stats
