"""Lookup synthesis: questions answered in text, from what an exploration read.

Hindsight synthesis takes every state an exploration reached as a goal, so it never writes a question
whose answer is a value (the environment's tier-1 tasks: "What is the cheapest fare ...?"): such a task
changes no state. Here each successful read call of the exploration (a search, a passenger look-up) is
a source of questions, as the profile's `lookups` of that operation describe them: which record field
answers, which record is meant (each one, or the cheapest of a route and date), and the question in
the `ids` form (the call's own argument values) and the `names` form (written as the environment's
own tasks are: cities, dates in words, a flight by airline and departure time).

A proposal's reference is the read call the question needs (rebuilt from the record, so a `names`
question looks a passenger up by name even where the exploration used the id) and a closing reply
stating the answer. Verification replays both in a fresh instance of the seed task: the call must
return a record that gives the same answer, the state must stay unchanged, and the closing reply
must pass `common.answers.answer_alone`, the strict grader (the expected value and no other value of its
sort). A rollout on a synthetic lookup is then graded by that same function (`grade_answer`).
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable, Collection
from typing import Any

from common.answers import answer_alone
from common.schemas import Trajectory
from task_manager.envs import EnvAccess
from task_manager.grading import Grade, GradingError
from task_manager.models import (
    Call,
    Exploration,
    LookupTarget,
    Proposal,
    Reference,
    StoredTask,
    canonical_hash,
)
from task_manager.profile import EnvProfile, Lookup, LookupForm
from task_manager.replay import replay
from task_manager.synthesize import SynthesisStats, observed_values

_SLOT = re.compile(r"\{([A-Za-z_]\w*)(?:\|([A-Za-z_]\w*))?\}")
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


def closing_reply(answer: str) -> str:
    """The reference's last message: the plain-text reply that ends a lookup (the wording SmolLM2 copied in
    the one-shot measurement of issue 14)."""
    return f"The answer is {answer}."


def records_of(observation: str) -> list[dict[str, Any]]:
    """The records a read call returned: a JSON object, or the objects of a JSON list."""
    try:
        data = json.loads(observation)
    except (ValueError, TypeError):
        return []
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list):
        return [item for item in data if isinstance(item, dict)]
    return []


def written_day(value: str) -> str | None:
    match = _ISO_DATE.fullmatch(value)
    if match is None or not 1 <= int(match.group(2)) <= 12:
        return None
    return f"{calendar.month_name[int(match.group(2))]} {int(match.group(3))}, {match.group(1)}"


def fill_template(template: str, slot: re.Pattern[str], value_of: Callable[[str], Any],
                  write: Callable[[str, str | None], str | None]) -> str | None:
    """`template` with each `slot` match (group 1 the name, group 2 its filter or None) replaced by
    `write(str(value_of(name)), filter)`; None when a value is missing or not a scalar, or `write` gives None."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        raw = value_of(match.group(1))
        written = None if raw is None or isinstance(raw, (dict, list)) else write(str(raw), match.group(2))
        if written is None:
            missing = True
            return ""
        return written

    out = slot.sub(value, template)
    return None if missing else out


def fill(template: str, record: dict[str, Any], arguments: dict[str, Any], glossary: dict[str, dict[str, str]]) -> str | None:
    """`template` with its slots filled from the record (else the call's arguments); None when a slot has no
    value or its filter does not know it."""

    def write(text: str, how: str | None) -> str | None:
        if how is None:
            return text
        return written_day(text) if how == "day" else glossary.get(how, {}).get(text)

    return fill_template(template, _SLOT, lambda name: record.get(name, arguments.get(name)), write)


def slot_fields(form: LookupForm) -> list[str]:
    names = [m.group(1) for m in _SLOT.finditer(form.query)]
    return list(dict.fromkeys([*names, *form.unique]))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def pick(records: list[dict[str, Any]], target: LookupTarget) -> dict[str, Any] | None:
    """The record `target` asks about among `records`, or None when there is none or it is ambiguous."""
    group = [r for r in records if all(r.get(k) == v for k, v in target.identity.items())]
    if target.select == "each":
        return group[0] if len(group) == 1 and target.field in group[0] else None
    of = target.of or target.field
    eligible = [r for r in group if all(_positive(r.get(w)) for w in target.where)
                and isinstance(r.get(of), (int, float)) and not isinstance(r.get(of), bool)]
    if not eligible:
        return None
    ordered = sorted(eligible, key=lambda r: r[of], reverse=target.select == "max")
    if len(ordered) > 1 and ordered[0][of] == ordered[1][of]:
        return None  # a tie: the question would have two answers
    return ordered[0] if target.field in ordered[0] else None


def _answer_text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


class LookupSynthesizer:
    """Proposes lookups from an exploration's successful read calls (no LLM, no environment access: the
    proposals are verified afterwards like any other)."""

    name = "lookup"

    def __init__(self, profile: EnvProfile, query_forms: tuple[str, ...] = ("ids",), max_lookups: int = 6,
                 asked: Collection[tuple[str, str]] | None = None) -> None:
        """`asked`: the (lookup kind, form) pairs to write (those the environment's own train tasks ask,
        `task_manager.kinds.asked_kinds`); None: every lookup of the profile in each of `query_forms`."""
        self.profile, self.query_forms, self.max_lookups = profile, tuple(query_forms), max_lookups
        self.asked = None if asked is None else frozenset(asked)

    def _forms(self, spec: Lookup) -> list[str]:
        if self.asked is None:
            return [f for f in self.query_forms if f in spec.forms]
        return [f for f in spec.forms if (spec.kind, f) in self.asked]

    def propose(self, exploration: Exploration) -> tuple[list[Proposal], SynthesisStats]:
        stats = SynthesisStats()
        operations = self.profile.operations()
        seen = observed_values(exploration)
        # Every question the exploration's reads answer, in exploration order, keyed by the record it reads.
        found: list[tuple[str, Proposal]] = []
        for step in exploration.steps:
            if step.failed or step.state_changed or len(step.calls) != 1:
                continue  # one read call per step: its observation is that call's answer
            call = step.calls[0]
            op = operations.get(call.name)
            records = records_of(step.observation)
            if op is None or not op.lookups or not records:
                continue
            for spec in op.lookups:
                for record in records:
                    for form_name in self._forms(spec):
                        form = spec.forms[form_name]  # type: ignore[index]
                        proposal = self._proposal(exploration, spec, form_name, form, record, call.arguments, records,
                                                  seen)
                        if proposal is not None:
                            found.append((canonical_hash([spec.kind, sorted(record.items(), key=str)]), proposal))
        # Variety first: records taken round-robin over the lookup kinds, so that the cap keeps one record of
        # each kind before a second of any; a record is asked about in every form.
        by_kind: dict[str, list[str]] = {}
        for key, proposal in found:
            assert proposal.lookup is not None
            queue = by_kind.setdefault(proposal.lookup.kind, [])
            if key not in queue:
                queue.append(key)
        order = [queue[i] for i in range(max((len(q) for q in by_kind.values()), default=0))
                 for queue in by_kind.values() if i < len(queue)]
        chosen = set(order[: self.max_lookups])
        proposals: list[Proposal] = []
        questions: set[str] = set()
        for key, proposal in found:
            if key in chosen and proposal.query not in questions:
                questions.add(proposal.query)
                proposals.append(proposal)
        # Each question (one per form) is put forward well-formed: proposed and parsed alike.
        stats.proposed = stats.parsed = len(proposals)
        return proposals, stats

    def _proposal(self, exploration: Exploration, spec: Lookup, form_name: str, form: LookupForm,
                  record: dict[str, Any], arguments: dict[str, Any], records: list[dict[str, Any]],
                  seen: Any) -> Proposal | None:
        identity = {f: record[f] for f in slot_fields(form) if f in record and f != spec.answer}
        target = LookupTarget(kind=spec.kind, operation="", field=spec.answer, select=spec.select, of=spec.of,
                              where=list(spec.where), identity=identity, answer="")
        if pick(records, target) is not record:
            return None  # not the record this question means (not the cheapest, or not singled out)
        answer = _answer_text(record.get(spec.answer))
        query = fill(form.query, record, arguments, self.profile.glossary)
        call_args = {k: fill(v, record, arguments, self.profile.glossary) for k, v in form.call.items()}
        if answer is None or query is None or any(v is None for v in call_args.values()):
            return None
        # Values of the same sort the reply must not state: the observation's other records (the route's other
        # fares), or where it held one record, the other values of that field the exploration saw (other
        # passengers' credit), as the environment's own lookups list their wrong answers.
        others = [r.get(spec.answer) for r in records if r is not record] if len(records) > 1 else \
            list(seen.by_key.get(spec.answer, {}))
        wrong = sorted({text for v in others if (text := _answer_text(v)) is not None} - {answer})
        operation = next(name for name, op in self.profile.operations().items() if spec in op.lookups)
        target = target.model_copy(update={"operation": operation, "answer": answer, "wrong_answers": wrong})
        call = Call(name=operation, arguments=call_args)
        return Proposal(query=query, confidence=1.0, actions=[call.render(), closing_reply(answer)], calls=[call],
                        recorded_initial_state=exploration.initial_state, synthesizer=self.name,
                        env_type=exploration.env_type, seed_task_id=exploration.seed_task_id,
                        exploration_id=exploration.exploration_id, query_form=form_name,  # type: ignore[arg-type]
                        lookup=target)


async def verify_lookup(access: EnvAccess, proposal: Proposal) -> tuple[Reference | None, str]:
    """Replay the lookup's call and closing reply in a fresh instance: (the reference, "ok") or (None, why)."""
    target = proposal.lookup
    assert target is not None
    result = await replay(access, proposal.env_type, proposal.seed_task_id, proposal.actions, query=proposal.query,
                          recorded_initial_state=proposal.recorded_initial_state)
    if not result.ok or not result.observations:
        return None, "replay_error"
    record = pick(records_of(result.observations[0]), target)
    if record is None or _answer_text(record.get(target.field)) != target.answer:
        return None, "answer_changed"  # the fresh instance does not give the answer the exploration saw
    end_state = None
    if result.end_state is not None:
        end_state = access.comparable(result.end_state)
        if end_state != access.comparable(result.initial_state):
            return None, "state_changed"  # a lookup reads; it must change nothing
    if not answer_alone(proposal.actions[-1], target.answer):
        return None, "grader_disagrees"  # the grader would not accept the reference's own reply
    reference = Reference(actions=result.executed, calls=proposal.calls, observations=result.observations,
                          initial_state=result.initial_state, end_state=end_state,
                          end_state_hash=canonical_hash(end_state) if end_state is not None else None,
                          answer=target.answer, wrong_answers=list(target.wrong_answers))
    return reference, "ok"


def final_reply(trajectory: Trajectory) -> str | None:
    """The plain-text reply that ended the episode, or None (it ended on a tool call, or did not end): the
    environment reads only such a reply as the answer."""
    if not trajectory.steps:
        return None
    last = trajectory.steps[-1]
    if not last.done or (last.observation is not None and last.observation.role == "tool"):
        return None
    return last.action.text()


def grade_answer(stored: StoredTask, trajectory: Trajectory | None, state: Any, comparable: Any) -> Grade:
    """1.0 when the episode ended with a reply stating the answer and no other value of its sort (a hedge scores
    0) and, where a state
    was sent, the state is unchanged; `comparable` maps a snapshot to its comparable view."""
    reference = stored.reference
    assert reference is not None and reference.answer is not None
    if trajectory is None:
        raise GradingError(f"task {stored.task.task_id!r} is a lookup, answered in text: send `trajectory` (and "
                           "`state`, the final state snapshot)")
    reply = final_reply(trajectory)
    correct = reply is not None and answer_alone(reply, reference.answer)
    if correct and state is not None and reference.end_state is not None:
        if isinstance(state, dict) and "state" in state and "instance_id" in state:
            state = state["state"]  # a whole env-service state response was sent
        correct = comparable(state) == reference.end_state
    return Grade(1.0 if correct else 0.0, "answer_match")
