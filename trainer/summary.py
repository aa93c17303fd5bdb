"""The end-of-run summary: what each mechanism did and held-out success before and after training.

Written to `<output_dir>/summary.json` and printed as rich tables by `python -m trainer` (the
launcher runs the trainer as a child and shows the same file). Confidence intervals are 95%, over
held-out tasks (the unit that varies between runs): normal approximation of the mean of per-task
values, and for a change the mean of paired per-task differences (the same tasks in both evaluations).
A run with a warm start evaluated after it has three evaluations, so the change splits in two: the warm
start's and RL's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from trainer.peers import ExperiencePeer, JudgePeer, TaskPeer
from trainer.rollout import EvalSummary, GroupStats, Rollout

Z95 = 1.959964


def interval(values: list[float], bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict[str, float]:
    """Mean and 95% confidence interval of the mean (normal approximation, clipped to `bounds`, the
    range the values can take; zero width for n < 2)."""
    n = len(values)
    if n == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "lo": mean, "hi": mean, "n": n}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return {"mean": mean, "lo": max(bounds[0], mean - half), "hi": min(bounds[1], mean + half), "n": n}


def per_task_values(summary: EvalSummary, threshold: float = 1.0) -> dict[str, dict[str, float]]:
    """Per held-out task: avg@k (success share of its k samples), best@k (any success), invalid rate."""
    out = {}
    for task_id, scores in summary.per_task.items():
        success = [float(s >= threshold) for s in scores]
        out[task_id] = {f"avg@{summary.k}": sum(success) / len(success), f"best@{summary.k}": max(success),
                        "invalid_action_rate": summary.per_task_invalid.get(task_id, 0.0)}
    return out


# A run's held-out evaluations in order (`warm_start`: right after the warm start, before the first RL step),
# and the paired changes between them: key, from, to. `delta` is always the total change.
EVALUATIONS = ("before", "warm_start", "after")
CHANGES = (("delta_warm_start", "before", "warm_start"), ("delta_rl", "warm_start", "after"), ("delta", "before", "after"))


def eval_table(before: EvalSummary | None, after: EvalSummary | None, split: str | None = None,
               warm_start: EvalSummary | None = None) -> dict[str, Any]:
    """Rows metric -> each evaluation and the paired changes between them, each a mean with its 95% interval;
    `split` names the held-out split the tasks came from. With `warm_start` the total change (`delta`, after -
    before) splits into the warm start's (`delta_warm_start`) and RL's (`delta_rl`, after - warm_start)."""
    given = dict(zip(EVALUATIONS, (before, warm_start, after), strict=True))
    evaluations = {name: summary for name, summary in given.items() if summary is not None}
    if not evaluations:
        return {"rows": [], "tasks": 0, "k": None, "split": split}
    runs = {name: per_task_values(summary) for name, summary in evaluations.items()}
    k = list(evaluations.values())[-1].k
    rows = []
    for metric in (f"avg@{k}", f"best@{k}", "invalid_action_rate"):
        row: dict[str, Any] = {"metric": metric}
        for name, values in runs.items():
            row[name] = interval([v[metric] for v in values.values()], (0.0, 1.0))
        for key, start, end in CHANGES:
            if start in runs and end in runs:
                paired = sorted(set(runs[start]) & set(runs[end]))
                row[key] = interval([runs[end][t][metric] - runs[start][t][metric] for t in paired], (-1.0, 1.0))
        rows.append(row)
    # A success without a tool call is a guess on a tool-use task: the share says how much of avg@k is skill.
    called = {name: s.successes_with_tool_call() for name, s in evaluations.items()}
    # Each task's sample outcomes, tool calls and prompt digest, so that a report can break results down (by kind,
    # by task) and pair two evaluations only where they showed the same prompt.
    per_task = {name: {"outcomes": s.per_task, "called": s.per_task_called, "prompts": s.per_task_prompt}
                for name, s in evaluations.items()}
    return {"rows": rows, "tasks": max(len(v) for v in runs.values()), "k": k, "split": split,
            "successes_with_tool_call": called, "per_task": per_task}


def mixed_outcome_groups(groups: Sequence[Sequence[Rollout]]) -> int:
    """Groups whose rollouts did not all get the same outcome: the only ones where GRPO's outcome term
    is not zero (ADCA's attribution term can still move the others)."""
    return sum(1 for group in groups if len({float(r.trajectory.outcome or 0.0) for r in group}) > 1)


# A gradient norm at or below this is float noise, not a signal: a step whose groups all had equal outcomes,
# taken while the policy still equals its KL reference, measures about 2.5e-7 on SmolLM2 (no term has a
# gradient, yet the forward passes differ in their last bits).
NOISE_GRAD_NORM = 1e-5


def training_signal(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """From the run's per-step metrics: did every step move the weights, and how many groups carried an
    outcome signal. A non-zero gradient is necessary, not sufficient (random judge labels also move
    weights), hence the share of mixed-outcome groups beside it.

    A step logged twice (re-run after a resume) counts once, its last record."""
    steps = {int(r["step"]): r for r in records if int(r.get("step", 0)) > 0 and "rollout/groups" in r}
    ordered = [steps[s] for s in sorted(steps)]
    norms = [float(r.get("update/grad_norm", 0.0)) for r in ordered]
    groups = sum(int(r.get("rollout/groups", 0)) for r in ordered)
    mixed = sum(int(r.get("rollout/mixed_outcome_groups", 0)) for r in ordered)
    nonzero = sum(1 for g in norms if g > NOISE_GRAD_NORM)
    # Updates skipped because their gradient was exactly 0 (every advantage 0): counted among the zero-grad steps.
    skipped = sum(int(r.get("update/skipped", 0.0)) for r in ordered)
    return {"steps": len(ordered), "steps_with_nonzero_grad": nonzero,
            "every_step_nonzero_grad": bool(ordered) and nonzero == len(ordered),
            "grad_norm_per_step": norms, "skipped_updates": skipped, "groups": groups,
            "mixed_outcome_groups": mixed, "mixed_outcome_share": mixed / groups if groups else None}


# Issue #14 point 7's bar for the loop's run; every check reads only the summary, so a recorded
# summary.json can be checked again.
PARSE_RATE_TARGET = 0.99


def _check(name: str, value: str, target: str, met: bool | None) -> dict[str, Any]:
    return {"check": name, "value": value, "target": target, "met": met}


def _counter_check(name: str, mechanism: dict[str, Any] | None, key: str, of: str | None = None) -> dict[str, Any]:
    """`key` above 0, or "off" when the mechanism did not run (`of`: the count it is out of)."""
    if mechanism is None:
        return _check(name, "off", "> 0", None)
    count = int(mechanism.get(key) or 0)
    return _check(name, f"{count} of {int(mechanism.get(of) or 0)}" if of else str(count), "> 0", count > 0)


def loop_checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """What the self-evolving loop's run must show (issue #14 point 7), one row per check: its value, the
    target and whether it was met (None: not measured in this run, e.g. the mechanism was off)."""
    rows = []
    ev = summary.get("eval") or {}
    avg = next((r for r in ev.get("rows") or [] if str(r["metric"]).startswith("avg@")), {})
    change, rl = avg.get("delta"), avg.get("delta_rl")
    where = f"{ev.get('tasks', 0)} {ev.get('split') or 'held-out'} tasks"
    if change and change.get("n"):
        # The total (after - before); after a warm start, RL's part of it beside (after - warm start).
        rl_part = f" (RL's part {_cell(rl, signed=True)})" if rl and rl.get("n") else ""
        rows.append(_check(f"held-out avg@{ev.get('k')} change, paired",
                           f"{_cell(change, signed=True)} on {where}{rl_part}", "95% CI above 0", change["lo"] > 0))
    else:
        rows.append(_check("held-out change, paired", "not evaluated before and after", "95% CI above 0", None))
    training = summary.get("training") or {}
    steps = int(training.get("steps") or 0)
    skipped = int(training.get("skipped_updates") or 0)
    rows.append(_check("steps with a non-zero gradient", f"{training.get('steps_with_nonzero_grad', 0)} of {steps}"
                       + (f" ({skipped} updates skipped: every advantage 0)" if skipped else ""),
                       "every step", bool(training.get("every_step_nonzero_grad")) if steps else None))
    groups, mixed = int(training.get("groups") or 0), int(training.get("mixed_outcome_groups") or 0)
    share = f" ({mixed / groups:.2f})" if groups else ""
    rows.append(_check("groups with mixed outcomes", f"{mixed} of {groups}{share}", "> 0 (an outcome signal)",
                       mixed > 0 if groups else None))
    if "environment_errors" in summary:  # a summary recorded before they were counted apart has none
        errors, rollouts = int(summary["environment_errors"]), int(summary.get("rollouts") or 0)
        rows.append(_check("rollouts ending in an environment error", f"{errors} of {rollouts}", "0", errors == 0))
    mechanisms = summary.get("mechanisms") or {}
    judge = mechanisms.get("self_attributing")
    if judge is None:
        rows.append(_check("judge parse rate", "off", f">= {PARSE_RATE_TARGET}", None))
    else:
        labelled = int(judge.get("steps_labelled") or 0)
        rate = judge.get("parse_rate", 0.0)
        rows.append(_check("judge parse rate", f"{rate:.3f} ({judge.get('parsed_labels', 0)} of {labelled} labels)",
                           f">= {PARSE_RATE_TARGET}", rate >= PARSE_RATE_TARGET if labelled else None))
    experience = mechanisms.get("self_navigating")
    rows.append(_counter_check("rollouts with injected experience", experience, "injected_rollouts"))
    rows.append(_counter_check("experience hits (of retrievals)", experience, "hits", of="retrievals"))
    share, known = (experience or {}).get("same_kind_share"), (experience or {}).get("demonstrations_kind_known")
    same = (experience or {}).get("demonstrations_same_kind")
    rows.append(_check("demonstrations of the task's own kind",
                       f"{share:.3f} ({same} of {known})" if known else "no kinds known",
                       f">= {SAME_KIND_TARGET}", share >= SAME_KIND_TARGET if known else None))
    rows.append(_counter_check("synthetic tasks sampled (of tasks)", mechanisms.get("self_questioning"),
                               "synthetic_sampled", of="tasks_sampled"))
    collapse = summary.get("collapse")
    if collapse is not None and collapse.get("enabled"):
        value = (f"{collapse['signal']} at step {collapse['step']}" if collapse.get("collapsed")
                 else f"none in {collapse.get('judged_steps', 0)} judged steps")
        rows.append(_check("collapse", value, "none", not collapse.get("collapsed")))
    return rows


SAME_KIND_TARGET = 0.8  # issue 35: a demonstration of another kind teaches the wrong call


def same_kind(stats: Any) -> dict[str, Any]:
    """Demonstrations shown where both kinds are known, those of the task's own kind, and their share."""
    known, same = stats.demos_kind_known, stats.demos_same_kind
    return {"demonstrations_kind_known": known, "demonstrations_same_kind": same,
            "same_kind_share": round(same / known, 4) if known else None}


async def _service_stats(peer: Any, name: str) -> dict[str, Any] | None:
    try:
        return await peer.stats()
    except Exception as exc:  # the summary must not fail a finished run
        logger.warning("{} stats unavailable: {}", name, exc)
        return None


async def mechanisms_summary(tasks: TaskPeer | None, experience: ExperiencePeer | None, judge: JudgePeer | None,
                             inject: str, stats: GroupStats, mode: str = "group_start") -> dict[str, Any]:
    """What each mechanism did: its peer's counters, and the statistics its service reports now."""
    mechanisms: dict[str, Any] = {}
    if tasks is not None:
        service = await _service_stats(tasks, "task manager")
        funnel = (service or {}).get("funnel", {})
        mechanisms["self_questioning"] = {
            **tasks.summary(), "tasks_proposed": funnel.get("proposed"), "tasks_kept": funnel.get("kept"),
            "funnel_by_kind": (service or {}).get("funnel_by_kind"),
            "service": service}
    if experience is not None:
        seeding = (mechanisms.get("self_questioning", {}).get("service") or {}).get("seeding") or {}
        mechanisms["self_navigating"] = {**experience.summary(),
                                         # inject: turns -- demonstrations shown as turns, and text fallbacks
                                         "inject": inject,
                                         # experience.mode action: the policy's asks; step: searches per step
                                         "mode": mode, "asks": stats.asks,
                                         "asks_over_budget": stats.asks_over_budget,
                                         "asking_rollouts": stats.asking_rollouts,
                                         "step_retrievals": stats.step_retrievals,
                                         "turns_injected": stats.turns_injected,
                                         "text_fallbacks": stats.text_fallbacks,
                                         # demonstrations cut to fit the context, and those that still did not
                                         "demonstrations_shortened": stats.demos_shortened,
                                         "demonstrations_dropped": stats.demos_dropped,
                                         **same_kind(stats),
                                         # pool seeding from verified synthetic tasks before training
                                         "seeded_trajectories": sum(int(r.get("sent", 0)) for r in seeding.values()),
                                         "seeded_experiences": sum(int(r.get("experiences_created", 0))
                                                                   for r in seeding.values()),
                                         "pool": await _service_stats(experience, "experience manager")}
    if judge is not None:
        mechanisms["self_attributing"] = {**judge.summary(),
                                          "service": await _service_stats(judge, "judge")}
    return mechanisms


@dataclass(frozen=True)
class RunRecord:
    """What the summary reads of a run, as plain values (the trainer fills it in at the end)."""

    collapsed: bool
    steps: int
    output_dir: Path
    run_id: str
    stats: GroupStats
    plot: Path | None
    before: EvalSummary | None  # held-out evaluation before the first step
    after: EvalSummary | None  # and after the last
    eval_split: str | None
    metrics: list[dict[str, Any]]  # the metrics log, one record per step
    warm_start: dict[str, Any] | None  # trainer.warm_start: data, token counts, loss curve
    resilience: dict[str, Any]
    collapse: dict[str, Any]
    after_warm_start: EvalSummary | None = None  # held-out evaluation between the warm start and the first step


def run_summary(run: RunRecord, mechanisms: dict[str, Any]) -> dict[str, Any]:
    stats = run.stats
    summary = {
        # collapsed: the collapse detectors stopped the run (`collapse` names the signal)
        "status": "collapsed" if run.collapsed else "finished",
        "steps": run.steps, "output_dir": str(run.output_dir), "run_id": run.run_id,
        "dropped_groups": stats.dropped_groups, "failed_attempts": stats.failed_attempts, "rollouts": stats.rollouts,
        "environment_errors": stats.environment_errors,  # rollouts the environment failed, not the policy
        "plot": str(run.plot) if run.plot else None,
        "eval": eval_table(run.before, run.after, split=run.eval_split, warm_start=run.after_warm_start),
        "training": training_signal(run.metrics),
        "warm_start": run.warm_start,
        "mechanisms": mechanisms,
        "resilience": run.resilience,
        "collapse": run.collapse,
    }
    summary["checks"] = loop_checks(summary)
    return summary


def write_summary(directory: Path, summary: dict[str, Any]) -> Path:
    path = Path(directory) / "summary.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(path)
    return path


def _cell(value: dict[str, float] | None, signed: bool = False) -> str:
    if not value or value.get("n", 0) == 0:
        return "-"
    sign = "+" if signed else ""
    return f"{value['mean']:{sign}.3f} [{value['lo']:{sign}.3f}, {value['hi']:{sign}.3f}]"


# Counters kept as a mapping whose every entry is printed (`labels_by_source/rule`), not skipped as nested.
SPLIT_COUNTERS = ("labels_by_source",)


def _counter_rows(values: dict[str, Any]) -> list[tuple[str, Any]]:
    rows = []
    for key, value in values.items():
        if key in SPLIT_COUNTERS and isinstance(value, dict):
            rows += [(f"{key}/{part}", count) for part, count in sorted(value.items())]
        elif not (isinstance(value, dict | list) or value is None):
            rows.append((key, value))
    return rows


def _eval_title(ev: dict[str, Any], what: str) -> str:
    split = f"{ev['split']} split, " if ev.get("split") else ""
    return f"{what} ({split}{ev['tasks']} tasks, k={ev['k']}): mean [95% CI]"


def _tool_call_cells(ev: dict[str, Any], names: Sequence[str]) -> list[str]:
    called = ev.get("successes_with_tool_call") or {}
    return [f"{called[n]:.3f}" if called.get(n) is not None else "-" for n in names]


def _print_before_after(console: Any, ev: dict[str, Any]) -> None:
    """One table: before, after and the paired change."""
    from rich.table import Table

    table = Table(title=_eval_title(ev, "held-out tasks"))
    for column in ("metric", "before", "after", "change (paired)"):
        table.add_column(column)
    for row in ev["rows"]:
        table.add_row(row["metric"], _cell(row.get("before")), _cell(row.get("after")),
                      _cell(row.get("delta"), signed=True))
    if any(v is not None for v in (ev.get("successes_with_tool_call") or {}).values()):
        table.add_row("successes with a tool call", *_tool_call_cells(ev, ("before", "after")), "")
    console.print(table)


def _print_three_evaluations(console: Any, ev: dict[str, Any]) -> None:
    """Two tables: the three evaluations (before, after the warm start, after RL), then the paired changes
    the warm start made, RL made, and both together."""
    from rich.table import Table

    table = Table(title=_eval_title(ev, "held-out tasks"))
    for column in ("metric", "before", "after the warm start", "after RL"):
        table.add_column(column)
    for row in ev["rows"]:
        table.add_row(row["metric"], *(_cell(row.get(name)) for name in EVALUATIONS))
    if any(v is not None for v in (ev.get("successes_with_tool_call") or {}).values()):
        table.add_row("successes with a tool call", *_tool_call_cells(ev, EVALUATIONS))
    console.print(table)
    table = Table(title=_eval_title(ev, "paired changes on the same tasks"))
    for column in ("metric", "warm start", "RL", "total"):
        table.add_column(column)
    for row in ev["rows"]:
        table.add_row(row["metric"], *(_cell(row.get(key), signed=True) for key, _, _ in CHANGES))
    console.print(table)


def print_summary(summary: dict[str, Any]) -> None:
    """Rich tables: the held-out evaluations and their paired changes with 95% intervals, each mechanism's
    counters, then the loop's checks."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ev = summary.get("eval") or {}
    if ev.get("rows"):
        if any("warm_start" in row for row in ev["rows"]):
            _print_three_evaluations(console, ev)
        else:
            _print_before_after(console, ev)
    for name, values in (summary.get("mechanisms") or {}).items():
        table = Table(title=name)
        table.add_column("counter")
        table.add_column("value", justify="right")
        for key, value in _counter_rows(values):
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)
    checks = summary.get("checks") or loop_checks(summary)
    table = Table(title="the self-evolving loop's checks (met: yes, NO, or - where the mechanism is off)")
    for column in ("check", "value", "target", "met"):
        table.add_column(column)
    for row in checks:
        table.add_row(row["check"], row["value"], row["target"], {True: "yes", False: "NO", None: "-"}[row["met"]])
    console.print(table)
    resilience = summary.get("resilience") or {}
    if resilience.get("outages"):
        table = Table(title="peer outages the run rode through")
        for column in ("peer", "outages", "survived", "waited s", "calls sent again", "gave up"):
            table.add_column(column, justify="left" if column == "peer" else "right")
        for peer, c in resilience["outages"].items():
            table.add_row(peer, str(c["outages"]), str(c["survived"]), f"{c['waited_s']:.1f}", str(c["retried_calls"]),
                          str(c["gave_up"]))
        console.print(table)
        console.print(f"rollouts retried {resilience.get('rollouts_retried')}, steps collected again "
                      f"{resilience.get('empty_step_retries')}, resumes from a checkpoint {resilience.get('resumes')}")
    if resilience.get("rollouts_lost_with_env_worker"):
        console.print(f"rollouts lost with an env worker (a Ray actor or its node) "
                      f"{resilience['rollouts_lost_with_env_worker']}, collected again on the others "
                      f"{resilience.get('rollouts_collected_again')}")
    for line in resilience.get("degradations") or []:
        console.print(f"degraded: {line}")
    collapse = summary.get("collapse") or {}
    if collapse.get("collapsed"):
        console.print(f"COLLAPSED: {collapse['message']}", style="bold red", markup=False)
    console.print(f"steps {summary.get('steps')}, dropped groups {summary.get('dropped_groups')}, "
                  f"curves {summary.get('plot')}, summary {Path(summary.get('output_dir', '.')) / 'summary.json'}")
