"""Multi-call synthesis: tasks of several calls (book the cheapest flight, cancel a booking, rebook) written in
the environment's own forms, from observed calls.

The input is a sequence of observed calls (`ObservedCall`: the call, what it returned, whether it failed and
whether it changed the state): an exploration's steps (`observed_calls`), or the tool calls and results a
gateway saw. For each multi-call kind of the profile (`EnvProfile.tasks`), every run of observed state
changes the kind is made of (its `changes`, in order) is a candidate: the records its query describes are
bound from what the reads before the last change returned (`RecordBinding`: the flight booked must be the
cheapest of its search, or, where the binding may `choose`, the booking is moved onto the cheapest flight of
the search it came from), its conditions are checked, and its query and reference calls are written in each
wanted form from the changes' arguments and results and the bound records. The reference is those calls and a
closing reply, as an agent's episode ends.

The expected state is what the observed changes did: the observed reads up to the last change and the
candidate's own changes (no other change; a moved one moved) replayed in a fresh instance of the seed task. A proposal carries it
as `goal_state`, so `verify` keeps the task only when a replay of its own reference reaches that state (a
reference that books another flight or cancels another order is rejected as `goal_not_reached`) and its own
reads still select what the query describes (`selection_changed`: in a fresh instance another flight can be
the cheapest, where the exploration had booked seats before it searched).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import BaseModel

from task_manager.envs import EnvAccess
from task_manager.kinds import lookup_kinds
from task_manager.lookups import fill_template, pick, records_of, written_day
from task_manager.models import Call, Exploration, LookupTarget, Proposal
from task_manager.profile import CHANGE_SLOT, EnvProfile, RecordBinding, TaskKind
from task_manager.replay import replay

# The reply that ends a multi-call task's reference: the environment's own references end with it too.
CLOSING_REPLY = "Done."

_SLOT = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|([A-Za-z_]\w*))?\}")


class ObservedCall(BaseModel):
    """One tool call as it was observed: what it returned, whether it failed, whether it changed the state."""

    call: Call
    result: str = ""
    failed: bool = False
    state_changed: bool = False


def observed_calls(exploration: Exploration) -> list[ObservedCall]:
    """An exploration's steps of one call each (a step of several calls has one observation for all of them)."""
    return [ObservedCall(call=s.calls[0], result=s.observation, failed=s.failed, state_changed=s.state_changed)
            for s in exploration.steps if len(s.calls) == 1]


def fill_slots(template: str, values: dict[str, Any], profile: EnvProfile) -> str | None:
    """`template` with its `{name}` / `{name|filter}` slots filled from `values`; None when a value is missing
    or its filter does not write it (a glossary without the value, a pattern that does not match)."""

    def write(text: str, how: str | None) -> str | None:
        if how is None:
            return text
        if how == "day":
            return written_day(text)
        if how in profile.glossary:
            return profile.glossary[how].get(text)
        if how in profile.patterns:
            found = re.search(profile.patterns[how], text)
            return found.group(1) if found and found.groups() else None
        raise ValueError(f"profile {profile.name!r}: unknown slot filter {how!r} in {template!r}; filters are "
                         f"day, the glossary's ({', '.join(profile.glossary)}) and the patterns' "
                         f"({', '.join(profile.patterns)})")

    return fill_template(template, _SLOT, values.get, write)


def _prefixed(name: str, fields: dict[str, Any], into: dict[str, Any]) -> None:
    for key, value in fields.items():
        into.setdefault(f"{name}.{key}", value)


def _selection(name: str, binding: RecordBinding, record: dict[str, Any]) -> LookupTarget:
    """What a min/max binding selects, as a target `pick` finds again: the record of `record`'s group (its
    `among` fields) with the least/greatest `of`, identified by the field it may `choose`, else its first
    matched field."""
    assert binding.of is not None  # RecordBinding refuses min/max without `of`
    key = binding.choose or next(iter(binding.match))
    return LookupTarget(kind=name, operation=binding.operation, field=key, select=binding.select, of=binding.of,
                        where=list(binding.where), answer=str(record.get(key)),
                        identity={f: record[f] for f in binding.among if f in record})


def selected(target: LookupTarget, records: list[dict[str, Any]]) -> bool:
    """Whether `records` (one read's result) select the record `target` names."""
    record = pick(records, target.model_copy(update={"field": target.of or target.field}))
    return record is not None and str(record.get(target.field)) == target.answer


def selection_kept(proposal: Proposal, observations: Sequence[str]) -> bool:
    """Whether the reference's own reads, replayed (`observations`, one per action), still select what the query
    describes: a fresh instance can differ from the exploration (seats the exploration booked before it
    searched are free again, so another flight may be the cheapest)."""
    calls = proposal.calls or []
    return all(any(call.name == target.operation and selected(target, records_of(observation))
                   for call, observation in zip(calls, observations, strict=False))
               for target in proposal.selections)


Rewrite = tuple[str, str, Any]  # a chosen change argument: (change, argument, value)


def _bind(binding: RecordBinding, reads: Sequence[ObservedCall], values: dict[str, Any],
          profile: EnvProfile) -> tuple[dict[str, Any] | None, Rewrite | None]:
    """The record `binding` describes, from the latest read that returned it, and the change argument rewritten to
    it where the binding may `choose` (the selected record of the group, not the one the change acted on); no
    record when no read returned it, or when it is not the one its `select` asks for."""
    wanted = {k: fill_slots(v, values, profile) for k, v in binding.match.items()}
    if any(v is None for v in wanted.values()):
        return None, None
    found: tuple[dict[str, Any], list[dict[str, Any]]] | None = None
    for observed in reads:
        if observed.call.name != binding.operation:
            continue
        records = records_of(observed.result)
        for record in records:
            if all(str(record.get(k)) == v for k, v in wanted.items()):
                found = (record, records)
    if found is None:
        return None, None
    record, records = found
    if binding.select == "each" or selected(_selection("", binding, record), records):
        return record, None
    if binding.choose is None:
        return None, None  # not the cheapest (or a tie): the task's query would not describe it
    target = _selection("", binding, record)
    chosen = pick(records, target.model_copy(update={"field": target.of}))
    if chosen is None or binding.choose not in chosen:
        return None, None  # a tie or no record with seats: no task
    slot = CHANGE_SLOT.fullmatch(binding.match[binding.choose])
    assert slot is not None  # RecordBinding checks `choose` names one change argument
    return chosen, (slot.group(1), slot.group(2), chosen[binding.choose])


class MultiCallSynthesizer:
    """Proposes the profile's multi-call tasks from observed calls; each proposal carries its expected state."""

    name = "multicall"

    def __init__(self, access: EnvAccess, profile: EnvProfile, query_forms: tuple[str, ...] = ("ids", "names"),
                 max_per_kind: int = 4, asked: Collection[tuple[str, str]] | None = None) -> None:
        """`asked`: the (kind, form) pairs to write (those the environment's own train tasks ask,
        `task_manager.kinds.asked_kinds`); None: every kind of the profile in each of `query_forms`."""
        self.access, self.profile = access, profile
        self.query_forms, self.max_per_kind = tuple(query_forms), max_per_kind
        self.asked = None if asked is None else frozenset(asked)
        self.labels = {key: label for key, (_, _, label) in lookup_kinds(profile).items()}

    def forms(self, spec: TaskKind) -> list[str]:
        if self.asked is None:
            return [f for f in self.query_forms if f in spec.forms]
        return [f for f in spec.forms if (spec.kind, f) in self.asked]

    def label(self, spec: TaskKind, form: str) -> str:
        return self.labels[(spec.kind, form)]

    async def propose(self, observed: Sequence[ObservedCall], *, env_type: str, seed_task_id: str,
                      initial_state: Any = None, exploration_id: str = ""
                      ) -> tuple[list[Proposal], Counter[tuple[str, str]]]:
        """The proposals, each with its expected state, and the candidates turned down by (kind label, reason):
        `no_expected_state` for a proposal whose observed changes do not replay on their own (it counts as
        proposed and rejected), `no_record:<name>` / `condition` / `unwritable` for runs of changes that are not
        a task of the kind (counted apart: they never were proposals)."""
        turned_down: Counter[tuple[str, str]] = Counter()
        proposals: list[Proposal] = []
        expected: dict[tuple[Any, ...], Any] = {}
        changes = [i for i, o in enumerate(observed) if o.state_changed and not o.failed]
        for spec in self.profile.tasks:
            forms = self.forms(spec)
            if not forms:
                continue
            per_kind = 0
            for combo in itertools.combinations(changes, len(spec.changes)):
                if per_kind >= self.max_per_kind:
                    break
                if [observed[i].call.name for i in combo] != spec.changes:
                    continue
                values, reason, selections, rewrites = self._values(spec, observed, combo)
                if values is None:
                    turned_down.update((self.label(spec, f), reason) for f in forms)
                    continue
                for form_name in forms:
                    form = spec.forms[form_name]  # type: ignore[index]
                    query = fill_slots(form.query, values, self.profile)
                    calls = [Call(name=c.name, arguments={k: fill_slots(v, values, self.profile)
                                                          for k, v in c.arguments.items()}) for c in form.calls]
                    if query is None or any(v is None for c in calls for v in c.arguments.values()):
                        turned_down[(self.label(spec, form_name), "unwritable")] += 1
                        continue
                    key = (combo, json.dumps(sorted(rewrites.items()), default=str))
                    if key not in expected:
                        expected[key] = await self._expected_state(observed, combo, rewrites, env_type,
                                                                   seed_task_id, initial_state)
                    if expected[key] is None:
                        turned_down[(self.label(spec, form_name), "no_expected_state")] += 1
                        continue
                    proposals.append(Proposal(
                        query=query, confidence=1.0, actions=[c.render() for c in calls] + [CLOSING_REPLY],
                        calls=calls, recorded_initial_state=initial_state, goal_state=expected[key],
                        synthesizer=self.name, env_type=env_type, seed_task_id=seed_task_id,
                        exploration_id=exploration_id, query_form=form_name, task=spec.kind,  # type: ignore[arg-type]
                        selections=selections))
                per_kind += 1
        return proposals, turned_down

    def _values(self, spec: TaskKind, observed: Sequence[ObservedCall], combo: tuple[int, ...]
                ) -> tuple[dict[str, Any] | None, str, list[LookupTarget], dict[int, dict[str, Any]]]:
        """The slot values of a run of changes (the changes' arguments, then their results' fields, then each
        bound record's fields), what its min/max bindings select and the changes' chosen arguments (observed
        index -> argument -> value); or None and why it is not a task of the kind."""
        selections: list[LookupTarget] = []
        rewrites: dict[int, dict[str, Any]] = {}
        values: dict[str, Any] = {}
        for name, index in zip(spec.changes, combo, strict=True):
            _prefixed(name, observed[index].call.arguments, values)
            for record in records_of(observed[index].result)[:1]:
                _prefixed(name, record, values)
        reads = [o for o in observed[: combo[-1]] if not o.failed and not o.state_changed]
        for name, binding in spec.records.items():
            record, rewrite = _bind(binding, reads, values, self.profile)
            if record is None:
                return None, f"no_record:{name}", [], {}
            if rewrite is not None:  # the change moved onto the chosen record: what its result said is stale
                change, argument, value = rewrite
                index = combo[spec.changes.index(change)]
                rewrites.setdefault(index, {})[argument] = value
                for key in [k for k in values if k.startswith(f"{change}.")]:
                    del values[key]
                _prefixed(change, {**observed[index].call.arguments, **rewrites[index]}, values)
            _prefixed(name, record, values)
            if binding.select != "each":
                selections.append(_selection(name, binding, record))
        for a, b in spec.same:
            if a not in values or b not in values or str(values[a]) != str(values[b]):
                return None, "condition", [], {}
        for a, b in spec.differ:
            if a not in values or b not in values or str(values[a]) == str(values[b]):
                return None, "condition", [], {}
        return values, "", selections, rewrites

    async def _expected_state(self, observed: Sequence[ObservedCall], combo: tuple[int, ...],
                              rewrites: dict[int, dict[str, Any]], env_type: str, seed_task_id: str,
                              initial_state: Any) -> Any:
        """The comparable state after the observed reads up to the last change and the run's own changes (with
        their chosen arguments), replayed in a fresh instance; None when that replay fails or changes nothing."""
        kept = [(i, o) for i, o in enumerate(observed[: combo[-1] + 1])
                if not o.failed and (not o.state_changed or i in combo)]
        actions = [Call(name=o.call.name, arguments={**o.call.arguments, **rewrites.get(i, {})}).render()
                   for i, o in kept]
        # A moved change's recorded result names another record: nothing to learn generated ids from.
        recorded = ["" if i in rewrites else o.result for i, o in kept]
        result = await replay(self.access, env_type, seed_task_id, actions, recorded_initial_state=initial_state,
                              recorded_observations=recorded)
        if not result.ok or result.end_state is None:
            return None
        end = self.access.comparable(result.end_state)
        return None if end == self.access.comparable(result.initial_state) else end
