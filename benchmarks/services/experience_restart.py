"""What an experience manager's restart costs on a long run's store, with and without journal compaction.

    .venv/bin/python benchmarks/services/experience_restart.py --store /tmp/soak/s20b/runs/soak/experience_store \
        [--restarts 3] [--out benchmarks/results/experience-restart.json]

For each setting (the code before compaction with `--before`, `journal_compact_records: 0`, never, and the
default), on its own copy of `--store` (a real
store, e.g. the soak's), the service is started, takes one write, and is restarted `--restarts` times, each time
after one more write. Each restart's time to healthy and the process's RSS once healthy are recorded, beside the
journal's size. RSS does not depend on the load; the times do (load averages beside them). Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402

from benchmarks.harness import REPO, load_avg  # noqa: E402
from tests.helpers import run_service  # noqa: E402


def restarts(store: Path, conf: Path, count: int, code: Path) -> list[dict]:
    rows = []
    for i in range(count + 1):
        started = time.perf_counter()
        with run_service("experience_manager", ["--store", str(store), "--conf", str(conf)], timeout=300,
                         env={"PYTHONPATH": str(code)}, cwd=code) as svc:
            healthy_s = time.perf_counter() - started
            rss_mb = psutil.Process(svc.proc.pid).memory_info().rss / 2**20
            peak_mb = int(Path(f"/proc/{svc.proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]) / 2**10
            with httpx.Client(base_url=svc.url, timeout=60) as http:
                http.post("/v1/workspaces/default/experiences", json={
                    "when_to_use": f"When restart {i} of the benchmark begins", "content": "Write one experience.",
                    "request_id": f"restart-bench-{i}-{time.time_ns()}"}).raise_for_status()
        journal = store / "journal.jsonl"
        rows.append({"start": i, "healthy_s": round(healthy_s, 2), "rss_mb_when_healthy": round(rss_mb, 1),
                     "peak_rss_mb": round(peak_mb, 1),
                     "journal_mb_after": round(journal.stat().st_size / 2**20, 2),
                     "journal_records_after": sum(1 for _ in journal.open("rb"))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, type=Path, help="an experience store folder; it is copied, not changed")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of the code before compaction (e.g. `git worktree add /tmp/old c21d014`): "
                             "its service runs on a third copy, as the baseline")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "experience-restart.json"))
    args = parser.parse_args()
    result = {"benchmark": "experience_restart", "store": str(args.store), "load_avg_start": load_avg(),
              "source_journal_mb": round((args.store / "journal.jsonl").stat().st_size / 2**20, 2), "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("never_compacted", 0, REPO), ("compacted_default", None, REPO)]
        if args.before:
            runs.insert(0, ("before_compaction_code", None, args.before))
        for name, compact, code in runs:
            store = Path(tmp) / name
            shutil.copytree(args.store, store)
            section = {"summary": {"mode": "heuristic"}}
            if compact is not None:
                section["journal_compact_records"] = compact
            conf = Path(tmp) / f"{name}.yaml"
            conf.write_text(yaml.safe_dump({"experience_manager": section}))
            result["settings"][name] = restarts(store, conf, args.restarts, code)
    result["load_avg_end"] = load_avg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
