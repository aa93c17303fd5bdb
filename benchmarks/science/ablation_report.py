"""The ablation's report from its raw JSON alone: REPORT.md (table, ordering check) and ablation.png.

Every number comes from `<results-dir>/<row>-seed<S>.json` as `benchmarks/science/ablation.py` wrote it; every
file there is used (no selection). Pooling over seeds: per test task, the mean over seeds of its avg@k
(or best@k), so the unit of the 95% interval is the task (n = tasks), the conservative choice when the
seeds share the tasks. Row-against-row differences are paired per task the same way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from benchmarks.science.ablation_common import (
    LABELS,
    LABELS_V2,
    LABELS_V3,
    ROWS_V1,
    ROWS_V2,
    ROWS_V3,
    failed_run_lines,
    paired,
    per_task_metric,
    success_lengths,
)
from benchmarks.science.ablation_criteria import (
    CRITERIA_V3,
    MIN_ROOM_TO_ACT,
    check_criteria,
    criteria_markdown,
    end_eval,
    per_kind,
)
from common.answers import answer_alone
from trainer.summary import interval

ROWS = tuple(dict.fromkeys((*ROWS_V1, *ROWS_V2, *ROWS_V3)))  # every row of any version, in table order
# AgentEvolver's ordering: base < +Q < +Q&N, +Q < +Q&A, and both below full.
ORDERING = (("base", "q"), ("q", "qn"), ("q", "qa"), ("qn", "full"), ("qa", "full"))


def load_results(directory: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """The completed runs, by row and seed (runs recorded as failed: `failed_runs`)."""
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for data in _ablation_files(directory):
        if "failed" not in data:
            runs.setdefault(data["row"], {})[int(data["seed"])] = data
    return runs


def failed_runs(directory: Path) -> list[dict[str, Any]]:
    """Runs recorded as failed (a collapse): row, seed and why; they have no evaluation, so no table cell."""
    return [{"row": d["row"], "seed": int(d["seed"]), **d["failed"]} for d in _ablation_files(directory)
            if "failed" in d]


def _ablation_files(directory: Path) -> list[dict[str, Any]]:
    found = [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*-seed*.json"))]
    return [d for d in found if d.get("benchmark") == "ablation"]


def seed_mean(runs: dict[str, dict[int, dict[str, Any]]], row: str, seeds: list[int], metric: str, *,
              require_call: bool = False) -> dict[str, float]:
    """Per task, the mean over `seeds` of the row's end metric."""
    per_seed = [per_task_metric(end_eval(runs, row, s), metric, require_call=require_call) for s in seeds]
    tasks = set.intersection(*(set(p) for p in per_seed))
    return {t: sum(p[t] for p in per_seed) / len(per_seed) for t in sorted(tasks)}


def row_difference(runs: dict[str, dict[int, dict[str, Any]]], low: str, high: str, metric: str) -> dict[str, Any] | None:
    """high - low per task (seed means over the seeds both rows have), with its 95% interval."""
    seeds = sorted(set(runs.get(low, {})) & set(runs.get(high, {})))
    if not seeds:
        return None
    for s in seeds:  # the same tasks and prompts, or the comparison is not paired
        paired(end_eval(runs, low, s), end_eval(runs, high, s), metric)
    a, b = seed_mean(runs, high, seeds, metric), seed_mean(runs, low, seeds, metric)
    return {**interval([a[t] - b[t] for t in a if t in b], (-1.0, 1.0)), "seeds": seeds}


def flights_answers(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, str] | None:
    """Each evaluated flights task's expected answer, from the environment config the rows trained with."""
    from env_service.environments.flights.env import FlightsEnvironment

    configs = [((d.get("config") or {}).get("env_service") or {}).get("environments", {}).get("flights")
               for r in runs.values() for d in r.values()]
    configs = [c for c in configs if c is not None]
    if not configs:
        return None
    env = FlightsEnvironment(configs[0])
    tasks = [env.task(t) for t in {t for r in runs for s in runs[r] for t in end_eval(runs, r, s)["per_task"]}]
    return {task.task_id: task.answer for task in tasks if task.answer is not None}


def single_value(result: dict[str, Any], answers: dict[str, str] | None) -> float | None:
    """avg@k re-graded from the recorded replies: a success that states the expected value and no other value
    of its sort (`common.answers.answer_alone`); None where replies were not recorded."""
    replies = result.get("replies")
    if not replies or answers is None or not set(result["per_task"]) <= set(answers):
        return None  # no recorded replies, or tasks graded on state rather than a text answer
    shares = []
    for task, scores in result["per_task"].items():
        ok = [score >= 1.0 and answer_alone(reply, answers[task])
              for score, reply in zip(scores, replies[task], strict=True)]
        shares.append(sum(ok) / len(ok))
    return sum(shares) / len(shares)


def steps_to_target(data: dict[str, Any], target_delta: float) -> int | None:
    curve = data["train"]["curve"]
    if not curve:  # the protocol ran without a curve (curve.enabled: false)
        return None
    target = curve[0]["avg@1"] + target_delta
    return next((p["step"] for p in curve[1:] if p["avg@1"] >= target - 1e-12), None)


def summarize(directory: Path) -> dict[str, Any]:
    runs = load_results(directory)
    if "base" not in runs:
        raise ValueError(f"{directory}: no base-seed*.json (the start evaluation); run the ablation first")
    any_run = next(iter(runs["base"].values()))
    k = any_run["eval_protocol"]["k"]
    commits = sorted({d["git"].get("commit") or "?" for r in runs.values() for d in r.values()})
    protocols = sorted({d["protocol"]["sha256"] for r in runs.values() for d in r.values()})
    answers = flights_answers(runs)
    rows = []
    for row in [r for r in ROWS if r in runs]:
        seeds = sorted(runs[row])
        label = {2: LABELS_V2, 3: LABELS_V3}.get(any_run.get("ablation_version", 1), LABELS)[row]
        entry: dict[str, Any] = {"row": row, "label": label, "seeds": seeds}
        # Successful samples by episode length: on one-call lookups, length 1 answered without any call.
        entry["success_lengths"] = {s: success_lengths(end_eval(runs, row, s)) for s in seeds}
        entry["single_value_avg"] = {s: single_value(end_eval(runs, row, s), answers) for s in seeds}
        for metric in ("avg", "best"):
            entry[f"{metric}_end"] = interval(list(seed_mean(runs, row, seeds, metric).values()), (0.0, 1.0))
            if row != "base":
                entry[f"{metric}_change"] = row_difference(runs, "base", row, metric)
        if row != "base":
            target = runs[row][seeds[0]].get("target_delta", 0.10)
            entry["steps_to_target"] = {s: steps_to_target(runs[row][s], target) for s in seeds}
            entry["steps"] = {s: runs[row][s]["train"]["steps"] for s in seeds}
            entry["minutes"] = {s: round(runs[row][s]["train"]["wall_s"] / 60, 1) for s in seeds}
        rows.append(entry)
    version = any_run.get("ablation_version", 1)
    failed = failed_runs(directory)
    criteria, kinds = [], {}
    if version >= 2:
        for entry in rows:
            _strict_columns(runs, entry)
        if version == 3:
            for entry in rows:
                _room_columns(runs, entry)
            criteria = check_criteria(runs, failed, CRITERIA_V3)
            kinds = per_kind(runs, [r["row"] for r in rows], CRITERIA_V3)
        else:
            criteria, kinds = check_criteria(runs, failed), per_kind(runs, [r["row"] for r in rows])
    ordering = []
    for low, high in ORDERING if version == 1 else ():
        diff = row_difference(runs, low, high, "avg") if low in runs and high in runs else None
        ordering.append({"lower": low, "higher": high, "difference": diff,
                         "holds": None if diff is None else diff["mean"] > 0,
                         "ci_excludes_0": None if diff is None else diff["lo"] > 0})
    return {"k": k, "tasks": any_run["eval_start"]["tasks"], "split": any_run["eval_protocol"]["split"],
            "temperature": any_run["eval_protocol"]["temperature"], "commits": commits,
            "protocol_sha256": protocols, "explore": any_run.get("explore", False), "rows": rows,
            "ordering": ordering, "failed": failed, "version": version, "criteria": criteria, "per_kind": kinds,
            "curves": {row: {s: d["train"]["curve"] for s, d in runs[row].items()}
                       for row in runs if row != "base" and all(d["train"]["curve"] for d in runs[row].values())}}


def _strict_columns(runs: dict[str, dict[int, dict[str, Any]]], entry: dict[str, Any]) -> None:
    """v2's metric beside v1's columns: strict avg@k and best@k (a success needs a tool call), the invalid-action
    rate, and the minutes per seed (training, evaluation, total)."""
    row, seeds = entry["row"], entry["seeds"]
    for metric in ("avg", "best"):
        entry[f"strict_{metric}_end"] = interval(list(seed_mean(runs, row, seeds, metric, require_call=True).values()),
                                                 (0.0, 1.0))
    entry["invalid_rate"] = {s: end_eval(runs, row, s).get("invalid_action_rate") for s in seeds}
    if row == "base":
        entry["minutes_split"] = {s: {"train": 0.0, "eval": round(runs[row][s]["eval_start"].get("seconds", 0) / 60, 2)}
                                  for s in seeds}
    else:
        entry["minutes_split"] = {s: runs[row][s].get("minutes") for s in seeds}


def _room_columns(runs: dict[str, dict[int, dict[str, Any]]], entry: dict[str, Any]) -> None:
    """v3's columns: per seed, the training groups with mixed outcomes and A's room to act (shares over every
    kind), and the forgetting evaluation (tier 1): its strict avg@k and its paired change from base."""
    row, seeds = entry["row"], entry["seeds"]
    if row == "base":
        return
    shares = {}
    for s in seeds:
        rollouts = runs[row][s].get("rollouts") or {}
        shares[s] = {"mixed": ((rollouts.get("mixed_outcome_groups") or {}).get("all") or {}).get("share"),
                     "room": ((rollouts.get("room_to_act") or {}).get("all") or {}).get("share")}
    entry["training_room"] = shares
    entry["forgetting"] = {s: {"strict_avg": f["strict_avg"], "change": f["paired_vs_start"]["strict_avg"]}
                           for s in seeds if (f := runs[row][s].get("forgetting"))}


def _v3_table(report: dict[str, Any]) -> list[str]:
    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["", "## Room for each mechanism and forgetting (v3)", "",
             "Mixed groups: the training groups whose outcomes differed (outcome-based advantages are zero elsewhere). "
             "Room to act: the judge-labelled steps whose label disagrees with their trajectory's outcome (under "
             f"{MIN_ROOM_TO_ACT:.2f}, a criterion on that row's labels reads 'no room'). Tier 1: the trained policy "
             "on the one-call tasks (strict avg, paired change from base).", "",
             "| row | mixed groups (per seed) | room to act (per seed) | tier 1 strict avg, change (per seed) |",
             "|---|---|---|---|"]
    for r in report["rows"]:
        if r["row"] == "base":
            continue
        room = r.get("training_room") or {}
        mixed = ", ".join(share(v["mixed"]) for v in room.values()) or "-"
        labels = ", ".join(share(v["room"]) for v in room.values()) or "-"
        tier1 = "; ".join(f"{f['strict_avg']:.3f}, {_cell(f['change'], True)}" for f in (r.get("forgetting") or {}).values())
        lines.append(f"| {r['label']} | {mixed} | {labels} | {tier1 or '-'} |")
    return lines


def _cell(value: dict[str, float] | None, signed: bool = False) -> str:
    if not value or value.get("n", 0) == 0 or math.isnan(value["mean"]):
        return "-"
    sign = "+" if signed else ""
    return f"{value['mean']:{sign}.3f} [{value['lo']:{sign}.3f}, {value['hi']:{sign}.3f}]"


def markdown(report: dict[str, Any]) -> str:
    k = report["k"]
    lines = [f"# Ablation: {report['split']} split, {report['tasks']} tasks, k = {k} at temperature "
             f"{report['temperature']}" + (" (EXPLORATION: validation split)" if report["explore"] else ""),
             "", f"Generated by `benchmarks/science/ablation.py --report` from every raw JSON file beside it. "
                 f"Commit(s): {', '.join(c[:10] for c in report['commits'])}; protocol sha256: "
                 f"{', '.join(p[:12] for p in report['protocol_sha256'])}.",
             f"Means over {report['split']} tasks of the per-task mean over seeds, 95% CI over tasks; changes are "
             "paired per task against base (the start evaluation, computed once per seed and shared by every row). "
             "Minutes: the training run's wall time over all its launcher invocations (evaluations not included). "
             f"Single-value avg@{k}: the same samples re-graded so that a success must state the expected value "
             "and no other value of its sort (the environment's grader only rejects other tasks' answers, so a "
             "hedge listing several values can pass it); '-' where the evaluation predates recorded replies.",
             "",
             f"| row | seeds | avg@{k} [95% CI] | change avg@{k} (paired) | best@{k} | change best@{k} (paired) "
             "| steps to target (per seed) | minutes (per seed) | successes by episode length (per seed) "
             f"| single-value avg@{k} (per seed) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        reach = ", ".join("-" if v is None else str(v) for v in (r.get("steps_to_target") or {}).values()) or "-"
        minutes = ", ".join(str(v) for v in (r.get("minutes") or {}).values()) or "-"
        lengths = "; ".join("not recorded" if v is None else (" ".join(f"{n} steps: {c}" for n, c in v.items()) or "none")
                            for v in (r.get("success_lengths") or {}).values()) or "-"
        single = ", ".join("-" if v is None else f"{v:.3f}" for v in (r.get("single_value_avg") or {}).values()) or "-"
        lines.append(f"| {r['label']} | {len(r['seeds'])} | {_cell(r['avg_end'])} | {_cell(r.get('avg_change'), True)} "
                     f"| {_cell(r['best_end'])} | {_cell(r.get('best_change'), True)} | {reach} | {minutes} | {lengths} "
                     f"| {single} |")
    if report.get("failed"):
        lines += ["", "Runs recorded as failed (not in the table; never resumed, never evaluated):", ""]
        lines += failed_run_lines(report["failed"], LABELS)
    if report.get("version") in (2, 3):
        lines += _strict_table(report)
        if report["version"] == 3:
            lines += _v3_table(report)
        lines += criteria_markdown(report["criteria"], report["per_kind"], [r["row"] for r in report["rows"]], k)
        return "\n".join(lines) + "\n"
    lines += ["", f"Paper's ordering (avg@{k}, paired per task, over the seeds both rows have):", ""]
    for o in report["ordering"]:
        name = f"{LABELS[o['lower']]} < {LABELS[o['higher']]}"
        if o["difference"] is None:
            lines.append(f"- {name}: not run")
        else:
            verdict = ("holds, CI excludes 0" if o["ci_excludes_0"] else "holds in the mean, CI includes 0"
                       if o["holds"] else "does NOT hold")
            seeds = ", ".join(str(s) for s in o["difference"]["seeds"])
            lines.append(f"- {name}: difference {_cell(o['difference'], True)} (seeds both rows have: {seeds}): "
                         f"{verdict}")
    return "\n".join(lines) + "\n"


def _strict_table(report: dict[str, Any]) -> list[str]:
    k = report["k"]
    lines = ["", f"## Strict avg@{k} (the protocol's metric: a success needs at least one tool call)", "",
             f"| row | seeds | strict avg@{k} [95% CI] | strict best@{k} [95% CI] | invalid-action rate (per seed) "
             "| minutes train / eval / total (per seed) |", "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        invalid = ", ".join("-" if v is None else f"{v:.3f}" for v in r["invalid_rate"].values())
        minutes = "; ".join("-" if m is None else f"{m.get('train', 0):.1f} / {m.get('eval', 0):.1f} / "
                            f"{m.get('total', m.get('train', 0) + m.get('eval', 0)):.1f}"
                            + (f" (+{m['shared_warm_start']:.1f} shared W)" if m.get("shared_warm_start") else "")
                            for m in r["minutes_split"].values())
        lines.append(f"| {r['label']} | {len(r['seeds'])} | {_cell(r['strict_avg_end'])} | {_cell(r['strict_best_end'])} "
                     f"| {invalid} | {minutes} |")
    return lines


def plot(report: dict[str, Any], path: Path) -> Path:
    """The validation-subset curve, one line per row (mean over its seeds), base as the flat start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    start = None
    for row, seeds in report["curves"].items():
        steps = sorted({p["step"] for curve in seeds.values() for p in curve})
        means = [sum(p["avg@1"] for c in seeds.values() for p in c if p["step"] == s)
                 / max(sum(1 for c in seeds.values() for p in c if p["step"] == s), 1) for s in steps]
        start = means[0] if start is None else start
        ax.plot(steps, means, marker="o", label=f"{LABELS[row]} ({len(seeds)} seeds)")
        ax.axhline(means[0], color="grey", lw=0.6, ls=":")
    ax.set_xlabel("training step")
    ax.set_ylabel("greedy avg@1, validation subset")
    ax.set_title("ablation training curves (step 0 = base)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_report(directory: Path) -> dict[str, Any]:
    directory = Path(directory)
    report = summarize(directory)
    (directory / "REPORT.md").write_text(markdown(report))
    png = plot(report, directory / "ablation.png") if report["curves"] else None
    (directory / "report.json").write_text(json.dumps({k: v for k, v in report.items() if k != "curves"}, indent=1))
    return {"benchmark": "ablation-report", "results_dir": str(directory), "rows": [r["row"] for r in report["rows"]],
            "report": str(directory / "REPORT.md"), "plot": str(png) if png else None,
            "ordering": {f"{o['lower']}<{o['higher']}": o["holds"] for o in report["ordering"]},
            "criteria": {c["name"]: c["verdict"] for c in report["criteria"]}}
