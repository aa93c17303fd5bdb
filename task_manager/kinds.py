"""Task kinds: what a task asks, by what it takes (its tool signature) and how it is worded (its form).

A kind is one short label, `<what>:<signature>:<form>`, e.g. `credit_lookup:get_passenger(name):names`:
`what` is a lookup's or a multi-call task's kind (the profile's `lookups` and `tasks`) or `goal`, the
signature is the reference's calls by tool name and argument names (never values, so a kind gives no
answer away), and the form is `ids` or `names`. Synthetic tasks carry it in `metadata.task_kind`; so do
the environment's own train tasks whose query has the wording of one of the profile's forms. The curriculum keeps solvability per kind, the experience manager keeps
a demonstration per kind and prefers one of the task's own kind, and the trainer records which kind each
rollout was shown.

Which lookups and multi-call tasks are worth synthesizing is read from the environment itself: a
profile's form whose query template matches the query of a train task is a (kind, form) the environment
asks. Held-out tasks
are never read for this; their kinds are those of the train split (the environment draws every split from
the same kinds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from task_manager.models import Call, Proposal
from task_manager.profile import EnvProfile

_SLOT = re.compile(r"\{[A-Za-z_][\w.]*(?:\|([A-Za-z_]\w*))?\}")


def call_signature(calls: Sequence[Call]) -> str:
    """The calls by tool and argument names, in order: `search_flight(date,destination,origin)`."""
    return " > ".join(f"{c.name}({','.join(sorted(c.arguments))})" for c in calls)


def kind_label(what: str, signature: str, form: str) -> str:
    return f"{what}:{signature}:{form}"


_DAY = r"[A-Z][a-z]+ \d{1,2}, \d{4}"  # what the `day` filter writes: "June 3, 2025"


def template_pattern(template: str, glossary: dict[str, dict[str, str]]) -> tuple[re.Pattern[str], int]:
    """A query template as a pattern of the queries it writes, and how specific it is: the literal text (spaces
    normalised), a filtered slot as what its filter writes (a date in words, a glossary entry), any other slot
    as any non-empty text. The specificity breaks ties: how many slots are filtered (a query a names form
    writes also fits its ids twin's pattern, "{origin}" being any text, never the other way round), then how
    many literal characters ("for passenger {id}." beats "for {name}.")."""
    template = " ".join(template.split())
    parts, last, filtered = [], 0, 0
    for match in _SLOT.finditer(template):
        parts.append(re.escape(template[last:match.start()]))
        how = match.group(1)
        if how == "day":
            parts.append(_DAY)
        elif how in glossary:
            parts.append("(?:" + "|".join(re.escape(v) for v in glossary[how].values()) + ")")
        else:
            parts.append(r".+?")
        filtered += how is not None
        last = match.end()
    parts.append(re.escape(template[last:]))
    literal = len(_SLOT.sub("", template))
    return re.compile("".join(parts), re.DOTALL), filtered * 10_000 + literal


def lookup_kinds(profile: EnvProfile) -> dict[tuple[str, str], tuple[re.Pattern[str], int, str]]:
    """(kind, form) -> (the form's query pattern, its specificity, the kind's label), for every lookup and
    every multi-call task kind (`tasks`) of the profile."""
    out = {}
    for spec in profile.tasks:
        for form_name, task_form in spec.forms.items():
            calls = [Call(name=c.name, arguments=dict.fromkeys(c.arguments, "")) for c in task_form.calls]
            pattern, specificity = template_pattern(task_form.query, profile.glossary)
            out[(spec.kind, form_name)] = (pattern, specificity, kind_label(spec.kind, call_signature(calls), form_name))
    for name, op in profile.operations().items():
        for spec in op.lookups:
            for form_name, form in spec.forms.items():
                call = Call(name=name, arguments={k: "" for k in form.call})
                pattern, filtered = template_pattern(form.query, profile.glossary)
                out[(spec.kind, form_name)] = (pattern, filtered,
                                               kind_label(spec.kind, call_signature([call]), form_name))
    return out


def classify(profile: EnvProfile, query: str) -> tuple[str, str] | None:
    """The (kind, form) whose query template writes `query`, or None (no lookup or multi-call task, or a tie
    between the most specific templates that fit)."""
    text = " ".join(query.split())
    fits = sorted(((filtered, key) for key, (pattern, filtered, _) in lookup_kinds(profile).items()
                   if pattern.fullmatch(text)), reverse=True)
    if not fits or (len(fits) > 1 and fits[0][0] == fits[1][0]):
        return None
    return fits[0][1]


def asked_kinds(profile: EnvProfile, queries: Iterable[str]) -> dict[tuple[str, str], int]:
    """How many of `queries` (train tasks' queries) each (kind, form) of the profile writes."""
    counts: dict[tuple[str, str], int] = {}
    for query in queries:
        key = classify(profile, query)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def proposal_kind(proposal: Proposal) -> str:
    """A proposal's kind label (`metadata.task_kind` of the task it becomes)."""
    what = proposal.lookup.kind if proposal.lookup is not None else proposal.task or "goal"
    return kind_label(what, call_signature(proposal.calls or []), proposal.query_form)
