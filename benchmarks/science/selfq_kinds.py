"""Self-questioning by task kind, read from a finished run folder: one JSON line.

    .venv/bin/python benchmarks/science/selfq_kinds.py runs/selfq-flights-v2

- the funnel per kind (the task manager's `funnel_by_kind` in the run's summary: proposed, verified, kept,
  held for the pool, withheld, trainable, rollouts tried and solved) and the run's totals;
- which demonstration every rollout given one was shown, from the rollout index: (task kind, shown kind)
  pairs, the same-kind share overall and per task kind, and the trainer summary's own count beside it.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def find(run: Path, name: str) -> Path:
    found = sorted(run.rglob(name))
    if not found:
        raise SystemExit(f"no {name} under {run}: is it a finished run folder?")
    return found[0]


def shown_kinds(index: Path) -> dict[str, Any]:
    pairs: Counter = Counter()
    for line in index.read_text().splitlines():
        entry = json.loads(line)
        shown = entry.get("demonstration")
        if entry.get("experience_flag") and shown:
            pairs[(entry.get("task_kind"), shown.get("kind"))] += 1
    known = {p: n for p, n in pairs.items() if p[0] and p[1]}
    per_kind: dict[str, dict[str, int]] = {}
    for (task, shown), n in known.items():
        row = per_kind.setdefault(task, {"shown": 0, "same_kind": 0})
        row["shown"] += n
        row["same_kind"] += n if task == shown else 0
    total, same = sum(known.values()), sum(n for (t, s), n in known.items() if t == s)
    return {"rollouts_shown_a_demonstration": sum(pairs.values()), "kinds_known": total, "same_kind": same,
            "same_kind_share": round(same / total, 4) if total else None, "per_task_kind": per_kind,
            "pairs": [{"task_kind": t, "shown_kind": s, "rollouts": n} for (t, s), n in sorted(pairs.items(), key=str)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run folder (runs/<experiment>)")
    args = parser.parse_args()
    summary = json.loads(find(args.run, "summary.json").read_text())
    questioning = summary["mechanisms"]["self_questioning"]
    service = questioning.get("service") or {}
    navigating = summary["mechanisms"].get("self_navigating") or {}
    result = {
        "run": str(args.run), "steps": summary.get("steps"), "rollouts": summary.get("rollouts"),
        "funnel": service.get("funnel"), "environments": service.get("environments"),
        "seeding": service.get("seeding"), "funnel_by_kind": questioning.get("funnel_by_kind"),
        "tasks_sampled": questioning.get("tasks_sampled"), "synthetic_sampled": questioning.get("synthetic_sampled"),
        "demonstrations": shown_kinds(find(args.run, "index.jsonl")),
        "summary_same_kind": {k: navigating.get(k) for k in ("demonstrations_kind_known", "demonstrations_same_kind",
                                                             "same_kind_share", "turns_injected", "seeded_experiences")},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
