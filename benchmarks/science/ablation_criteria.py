"""The v2 ablation's pre-registered success criteria (issue 36), checked on the raw JSON alone.

The metric is strict avg@k: a sample succeeds when the environment's strict grader passed it **and** its
episode made at least one tool call (a call-free guess counts 0), paired per task. A difference between two
rows is computed per task as the mean over the seeds both rows completed (a run recorded as failed, a
collapse stop, is left out and listed), with the 95% interval over tasks (`trainer.summary.interval`).

- A comparison **adds** when the interval's lower bound is above 0 and at least `MIN_POSITIVE_SEEDS` seeds
  have a positive mean difference.
- W **comes close to environment data** when the lower bound of (W - Env-W) is above -`CLOSE_MARGIN`.
- The smallest detectable difference: (z(1 - alpha/2) + z(power)) * sd / sqrt(n) over the n paired task
  differences (alpha 0.05 two-sided, power 0.80). A criterion not met whose observed difference is smaller
  than that is **not detectable** (neither shown to add nor shown not to). The comparisons are made without a
  correction for their number (`len(CRITERIA)`), stated in the report.
- A criterion whose rows have no common completed seed is **missing** (a partial grid still reports).
- A comparison whose interval is above 0, on a partial grid where the seeds still to run (of
  `SEEDS_PER_ROW`; a failed run's seed is settled, never rerun) could still bring it to `MIN_POSITIVE_SEEDS`
  positive, is **too few seeds**: the seed rule cannot be judged yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

from benchmarks.science.ablation_common import LABELS_V2, LABELS_V3, paired, per_task_metric
from trainer.summary import interval

ALPHA, POWER = 0.05, 0.80
MIN_POSITIVE_SEEDS = 2
SEEDS_PER_ROW = 3  # pre-registered as "at least 2 of 3 seeds"; the raw JSON does not record the protocol's count
CLOSE_MARGIN = 0.10
MIN_ROOM_TO_ACT = 0.10  # v3: a step-credit criterion whose labels disagree with the outcome less often has no room
LABELS = {**LABELS_V2, **LABELS_V3}  # the rows both versions have are labelled alike


@dataclass(frozen=True)
class Criterion:
    name: str
    low: str
    high: str
    kind: Literal["adds", "close"]
    room: str | None = None  # v3: the row whose judge labels measure A's room to act in this comparison


CRITERIA: tuple[Criterion, ...] = (
    Criterion("self-questioning's references", "base", "w", "adds"),
    Criterion("RL on synthetic tasks", "w", "w_q", "adds"),
    Criterion("N (same-kind demonstrations)", "w_q", "w_qn", "adds"),
    Criterion("A (reference-guided attribution)", "w_q", "w_qa", "adds"),
    Criterion("A on top of N", "w_qn", "w_full", "adds"),
    Criterion("the loop", "base", "w_full", "adds"),
    Criterion("self-questioning comes close to environment data", "env_w", "w", "close"),
)

# v3 (issue 51), on multi-call tasks. `BETTER_OF_A_N`: the one of W+Q&A and W+Q&N with the higher strict avg@k
# (per-task seed means, over the seeds the three rows share), chosen when the criterion is checked.
BETTER_OF_A_N = "better of w_qa and w_qn"
CRITERIA_V3: tuple[Criterion, ...] = (
    Criterion("A (reference-rule attribution) over GRPO", "w_q", "w_qa", "adds", room="w_qa"),
    Criterion("G (GiGPO's judge-free step credit) over GRPO", "w_q", "w_qg", "adds"),
    Criterion("A over G", "w_qg", "w_qa", "adds", room="w_qa"),
    Criterion("N (same-kind demonstrations) over GRPO", "w_q", "w_qn", "adds"),
    Criterion("full over the better of A and N", BETTER_OF_A_N, "w_full", "adds", room="w_full"),
)


# ---------------------------------------------------------------------------------------------- math


def sample_sd(values: list[float]) -> float:
    """The sample standard deviation (n - 1); 0 for fewer than 2 values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def detectable_difference(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference a paired test of n differences with this sd detects (two-sided alpha)
    with the given power: (z(1 - alpha/2) + z(power)) * sd / sqrt(n); infinite below 2 pairs."""
    if n < 2:
        return math.inf
    z = NormalDist().inv_cdf
    return (z(1 - alpha / 2) + z(power)) * sd / math.sqrt(n)


def adds_verdict(difference: dict[str, Any] | None, positive_seeds: int, detectable: float,
                 seeds_to_run: int = 0) -> str:
    if difference is None:
        return "missing"
    if difference["lo"] > 0 and positive_seeds >= MIN_POSITIVE_SEEDS:
        return "met"
    if difference["lo"] > 0 and positive_seeds + seeds_to_run >= MIN_POSITIVE_SEEDS:
        return "too few seeds"  # the seeds still to run can meet the seed rule: a partial grid is not "not met"
    return "not detectable" if abs(difference["mean"]) < detectable else "not met"


def close_verdict(difference: dict[str, float] | None, detectable: float, margin: float = CLOSE_MARGIN) -> str:
    if difference is None:
        return "missing"
    if difference["lo"] > -margin:
        return "met"
    return "not detectable" if detectable > margin else "not met"


# ---------------------------------------------------------------------------------------------- on the runs

Runs = dict[str, dict[int, dict[str, Any]]]


def end_eval(runs: Runs, row: str, seed: int) -> dict[str, Any]:
    """A row's evaluation at the end; base's is its start evaluation (no training)."""
    data = runs[row][seed]
    return data["eval_start"] if row == "base" else data["eval_end"]


def compare(runs: Runs, low: str, high: str, metric: str = "avg", tasks: set[str] | None = None, *,
            same_prompts: bool = True) -> dict[str, Any] | None:
    """high - low on strict `metric`, paired per task over the seeds both rows completed (optionally only
    `tasks`): the interval over tasks of the per-task seed mean, each seed's mean difference, the sd and the
    smallest detectable difference. None when the rows share no completed seed. `same_prompts: false` pairs two
    agents that show a task in prompts of their own (the gateway's agent against the in-loop template)."""
    seeds = sorted(set(runs.get(low, {})) & set(runs.get(high, {})))
    if not seeds:
        return None
    per_seed: list[dict[str, float]] = []
    for seed in seeds:
        before, after = end_eval(runs, low, seed), end_eval(runs, high, seed)
        if same_prompts:
            paired(before, after, metric, require_call=True)  # same tasks, same prompts
        a = per_task_metric(after, metric, require_call=True)
        b = per_task_metric(before, metric, require_call=True)
        per_seed.append({t: a[t] - b[t] for t in a if t in b and (tasks is None or t in tasks)})
    common = sorted(set.intersection(*(set(d) for d in per_seed)))
    if not common:
        return None
    pooled = [sum(d[t] for d in per_seed) / len(per_seed) for t in common]
    seed_means = {s: sum(d[t] for t in common) / len(common) for s, d in zip(seeds, per_seed, strict=True)}
    sd = sample_sd(pooled)
    return {**interval(pooled, (-1.0, 1.0)), "seeds": seeds, "seed_means": seed_means,
            "positive_seeds": sum(1 for v in seed_means.values() if v > 0), "sd": sd,
            "detectable": detectable_difference(sd, len(pooled))}


def better_of(runs: Runs, rows: tuple[str, ...], against: str) -> str | None:
    """Of `rows`, the one with the higher strict avg@k over the seeds they and `against` all completed (the
    first on a tie); None when they share no seed."""
    seeds = sorted(set.intersection(*(set(runs.get(r, {})) for r in (*rows, against))))
    if not seeds:
        return None

    def mean(row: str) -> float:
        per_seed = [per_task_metric(end_eval(runs, row, s), "avg", require_call=True) for s in seeds]
        return sum(sum(p.values()) / len(p) for p in per_seed) / len(per_seed)

    return max(rows, key=lambda r: (mean(r), -rows.index(r)))


def resolved(runs: Runs, criterion: Criterion) -> Criterion:
    """The criterion with `BETTER_OF_A_N` replaced by the row it names on these runs (unchanged when unresolved)."""
    if criterion.low != BETTER_OF_A_N:
        return criterion
    low = better_of(runs, ("w_qa", "w_qn"), criterion.high)
    return criterion if low is None else Criterion(criterion.name, low, criterion.high, criterion.kind, criterion.room)


def room_to_act(runs: Runs, row: str | None) -> float | None:
    """A's room to act in `row`, pooled over its completed seeds: labelled steps whose label disagrees with their
    trajectory's outcome, of all labelled steps; None when no run recorded it."""
    steps = against = 0
    for data in (runs.get(row, {}) if row else {}).values():
        room = ((data.get("rollouts") or {}).get("room_to_act") or {}).get("all")
        if room:
            steps, against = steps + room["steps"], against + room["against_outcome"]
    return against / steps if steps else None


def check_criteria(runs: Runs, failed: list[dict[str, Any]],
                   criteria: tuple[Criterion, ...] = CRITERIA) -> list[dict[str, Any]]:
    """Each criterion with its difference and verdict (met / not met / not detectable / missing; v3's step-credit
    criteria: "no room" where under `MIN_ROOM_TO_ACT` of the labels disagree with the outcome)."""
    out = []
    for c in (resolved(runs, c) for c in criteria):
        if c.low == BETTER_OF_A_N:
            out.append({"name": c.name, "low": c.low, "high": c.high, "kind": c.kind, "difference": None,
                        "verdict": "missing", "failed_runs": [f for f in failed if f["row"] == c.high],
                        "room_to_act": None})
            continue
        diff = compare(runs, c.low, c.high)
        detectable = diff["detectable"] if diff else math.inf
        failed_runs = [f for f in failed if f["row"] in (c.low, c.high)]
        # a failed run is never rerun: its seed is settled, not still to run
        settled = set(diff["seeds"] if diff else ()) | {f["seed"] for f in failed_runs}
        verdict = (adds_verdict(diff, diff["positive_seeds"] if diff else 0, detectable,
                                max(0, SEEDS_PER_ROW - len(settled))) if c.kind == "adds"
                   else close_verdict(diff, detectable))
        room = room_to_act(runs, c.room)
        if room is not None and room < MIN_ROOM_TO_ACT:
            verdict = "no room"
        out.append({"name": c.name, "low": c.low, "high": c.high, "kind": c.kind, "difference": diff,
                    "verdict": verdict, "failed_runs": failed_runs, **({"room_to_act": room} if c.room else {})})
    return out


def kinds_of(runs: Runs) -> dict[str, str]:
    """Each evaluated task's kind, as the harness recorded it beside the evaluation."""
    kinds: dict[str, str] = {}
    for row in runs:
        for seed in runs[row]:
            kinds.update(end_eval(runs, row, seed).get("kinds") or {})
    return kinds


def per_kind(runs: Runs, rows: list[str], criteria: tuple[Criterion, ...] = CRITERIA) -> dict[str, Any]:
    """Per task kind: each row's strict avg@k (per-task seed mean, 95% CI over the kind's tasks) and each
    criterion's paired difference on the kind's tasks."""
    kinds = kinds_of(runs)
    table: dict[str, Any] = {}
    for kind in sorted(set(kinds.values())):
        tasks = {t for t, k in kinds.items() if k == kind}
        row_cells = {}
        for row in rows:
            seeds = sorted(runs.get(row, {}))
            if not seeds:
                continue
            per_seed = [per_task_metric(end_eval(runs, row, s), "avg", require_call=True) for s in seeds]
            means = [sum(p[t] for p in per_seed) / len(per_seed) for t in sorted(tasks)
                     if all(t in p for p in per_seed)]
            row_cells[row] = interval(means, (0.0, 1.0))
        diffs = {c.name: compare(runs, c.low, c.high, tasks=tasks) if c.low != BETTER_OF_A_N else None
                 for c in (resolved(runs, c) for c in criteria)}
        table[kind] = {"tasks": len(tasks), "rows": row_cells, "criteria": diffs}
    return table


def _signed(d: dict[str, float] | None) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["mean"]):
        return "-"
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"


def _plain(d: dict[str, float] | None) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["mean"]):
        return "-"
    return f"{d['mean']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def criteria_markdown(criteria: list[dict[str, Any]], kinds: dict[str, Any], rows: list[str], k: int) -> list[str]:
    lines = ["", f"## Pre-registered criteria (strict avg@{k}: a success needs a tool call; paired per task)", "",
             f"{len(criteria)} comparisons, each at 95% with no correction for their number. 'adds': CI lower bound "
             f"> 0 and at least {MIN_POSITIVE_SEEDS} of {SEEDS_PER_ROW} seeds positive; 'comes close': CI lower "
             f"bound of the difference > -{CLOSE_MARGIN:.2f}. Smallest detectable difference: "
             "(z(0.975) + z(0.80)) x sd / sqrt(n) over the n paired task differences (80% power); a criterion "
             "not met whose difference is smaller is 'not detectable'. 'too few seeds': CI lower bound > 0 and "
             "the seeds still to run can meet the seed rule. 'missing': a row not run yet (or only failed runs).", "",
             "| criterion | comparison | difference [95% CI] | seeds (positive) | detectable | verdict |",
             "|---|---|---|---|---|---|"]
    for c in criteria:
        d = c["difference"]
        seeds = "-" if d is None else f"{', '.join(str(s) for s in d['seeds'])} ({d['positive_seeds']})"
        detectable = "-" if d is None or math.isinf(d["detectable"]) else f"{d['detectable']:.3f}"
        failed = "".join(f"; {LABELS[f['row']]} seed {f['seed']} FAILED ({f.get('signal')})" for f in c["failed_runs"])
        low = LABELS.get(c["low"], c["low"])
        room = f" (room to act {c['room_to_act']:.2f})" if c.get("room_to_act") is not None else ""
        lines.append(f"| {c['name']} | {LABELS[c['high']]} - {low} | {_signed(d)} | {seeds} "
                     f"| {detectable} | **{c['verdict']}**{room}{failed} |")
    for kind, entry in kinds.items():
        lines += ["", f"### Kind `{kind}` ({entry['tasks']} tasks)", "",
                  "| row | strict avg@k [95% CI] |", "|---|---|"]
        lines += [f"| {LABELS[r]} | {_plain(entry['rows'][r])} |" for r in rows if r in entry["rows"]]
        lines += ["", "| criterion | difference [95% CI] |", "|---|---|"]
        lines += [f"| {name} | {_signed(d)} |" for name, d in entry["criteria"].items()]
    return lines
