"""Chaos: SIGKILL every service once, then the trainer, during one launcher run; what each outage cost.

    .venv/bin/python benchmarks/services/chaos.py [--steps 40] [--model tiny] [--out benchmarks/results/chaos.json]

Runs `launcher.py` on a config like the quickstart's (flights, synthesis, all five services, ADCA-GRPO
with the judge, experience for half of each group, the policy served by llm_server) with the tiny
model, a checkpoint every step, and the launcher's restart backoff long enough that every outage
outlasts a step (so the trainer meets each one). After at least one clean step, each service in
turn (env_service, experience_manager, task_manager, judge, llm_server) and then the trainer is
SIGKILLed; the launcher restarts it.

Right before each store's service is killed, what it acknowledged is read back (experience ids,
plus one experience this script writes and gets acknowledged just before the kill; task ids and
each task's recorded rollouts), and read again once it is healthy: nothing may be missing.

Prints one JSON line: per killed child the outage (kill -> healthy again; the trainer: kill -> its
restart), the step it hit, the steps logged again, and the wall time it cost: from the last step
logged before the kill to the first new step logged after the child was back, minus the median
undisturbed step times the steps gained in that span; then the run's result (exit code, steps, empty steps, the trainer's
resilience counters from summary.json). `tests/launcher/test_chaos.py` runs the same and asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import emit, full_stack_config, start_launcher  # noqa: E402
from tests.helpers import stop_group  # noqa: E402

SERVICES = ("env_service", "experience_manager", "task_manager", "judge", "llm_server")



class StepWatch(threading.Thread):
    """Polls the trainer's metrics.jsonl; keeps (time first seen, step) of every record."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.records, self.seen = path, [], 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.path.is_file():
                lines = [line for line in self.path.read_text().splitlines() if line.strip()]
                now = time.monotonic()
                for line in lines[self.seen:]:
                    record = json.loads(line)
                    self.records.append((now, record))
                self.seen = len(lines)
            time.sleep(0.1)

    def step(self) -> int:
        return int(self.records[-1][1]["step"]) if self.records else 0


def _pid(log_text: str, name: str) -> int | None:
    found = re.findall(rf"started {name}(?: on port \d+)? \(pid (\d+)", log_text)
    return int(found[-1]) if found else None


def _restarted(log: Path, name: str, old_pid: int, url: str | None) -> bool:
    pid = _pid(log.read_text(errors="replace"), name)
    return pid is not None and pid != old_pid and (url is None or _healthy(url))


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the launcher exited ({proc.returncode}) while waiting for {what}:\n"
                               f"{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"no {what} within {timeout:.0f}s:\n{log.read_text(errors='replace')[-4000:]}")


def _experience_ids(url: str, workspace: str) -> set[str]:
    ids: set[str] = set()
    offset = 0
    while True:
        page = httpx.get(f"{url}/v1/workspaces/{workspace}/experiences",
                         params={"status": "all", "offset": offset, "limit": 500}, timeout=30).json()
        batch = page.get("experiences", [])
        ids |= {e["experience_id"] for e in batch}
        if len(batch) < 500:
            return ids
        offset += 500


def _acknowledge_probe(url: str, workspace: str) -> str:
    """One experience the manager acknowledges (200) immediately before it is killed."""
    body = {"when_to_use": f"chaos probe {uuid.uuid4().hex[:8]}", "content": "written right before a SIGKILL",
            "request_id": uuid.uuid4().hex}
    response = httpx.post(f"{url}/v1/workspaces/{workspace}/experiences", json=body, timeout=30)
    response.raise_for_status()
    return response.json()["experience"]["experience_id"]


def _task_rows(url: str) -> dict[str, int]:
    """Every stored task and the rollouts its curriculum has recorded."""
    tasks = httpx.get(f"{url}/v1/tasks", params={"limit": 1000}, timeout=30).json()["tasks"]
    rows = {}
    for task in tasks:
        detail = httpx.get(f"{url}/v1/tasks/{task['task_id']}", params={"env": task["env_type"]}, timeout=30).json()
        rows[task["task_id"]] = int(detail.get("rollouts", 0))
    return rows


def run_chaos(workdir: Path, *, steps: int = 40, model: str = "tiny", backoff_s: float = 3.0,
              timeout_s: float = 900.0) -> dict[str, Any]:
    runs = workdir / "runs"
    conf = workdir / "chaos.yaml"
    config = full_stack_config(experiment="chaos", runs=runs, model=model)
    # A restart waits backoff_s, so every outage outlasts a training step and the trainer meets it.
    config["launcher"].update(restart={"max_restarts": 2, "backoff_s": backoff_s, "backoff_max_s": backoff_s,
                                       "trainer": True}, ray={"enabled": False})
    config["trainer"]["steps"] = steps
    conf.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = runs / "chaos"
    log = workdir / "launcher.out"
    started = time.monotonic()
    proc = start_launcher(conf, log)
    watch = StepWatch(run_dir / "trainer" / "metrics.jsonl")
    watch.start()
    kills: list[dict[str, Any]] = []
    lost: list[str] = []
    try:
        _wait(lambda: "all services healthy" in log.read_text(errors="replace"), 600, "all services healthy",
              proc, log)
        data = yaml.safe_load((run_dir / "config.yaml").read_text())
        urls = {name: f"http://127.0.0.1:{data[name]['port']}" for name in SERVICES}
        workspace = (data["trainer"].get("experience") or {}).get("workspace", "default")
        for name in (*SERVICES, "trainer"):
            after = watch.step() + 1  # one clean step since the last outage
            _wait(lambda after=after: watch.step() >= after, timeout_s, f"step {after}", proc, log)
            before: Any = None
            if name == "experience_manager":
                probe = _acknowledge_probe(urls[name], workspace)
                before = _experience_ids(urls[name], workspace)
                assert probe in before
            elif name == "task_manager":
                before = _task_rows(urls[name])
            pid = _pid(log.read_text(errors="replace"), name)
            assert pid is not None, name
            step_at_kill, t_kill = watch.step(), time.monotonic()
            os.kill(pid, signal.SIGKILL)
            url = urls.get(name)  # the trainer has none: back once the launcher started it again
            _wait(lambda name=name, pid=pid, url=url: _restarted(log, name, pid, url), 300, f"{name} back", proc, log)
            t_back = time.monotonic()
            if name == "experience_manager":
                missing = before - _experience_ids(urls[name], workspace)
                lost += [f"experience {e}" for e in sorted(missing)]
            elif name == "task_manager":
                now = _task_rows(urls[name])
                lost += [f"task {t} (rollouts {n} -> {now.get(t)})" for t, n in before.items() if now.get(t, -1) < n]
            kills.append({"child": name, "t_kill": t_kill, "t_back": t_back, "step_at_kill": step_at_kill,
                          "outage_s": round(t_back - t_kill, 2)})
        code = proc.wait(timeout=timeout_s)
    finally:
        stop_group(proc, signal.SIGINT, 60)
        time.sleep(0.3)
        watch.stop.set()
        watch.join(timeout=5)
    summary_path = run_dir / "trainer" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return {"exit_code": code, "wall_s": round(time.monotonic() - started, 1), "steps": steps,
            "summary_steps": summary.get("steps"), "kills": _costs(kills, watch.records), "lost": lost,
            "empty_steps": [r["step"] for _, r in watch.records if r.get("rollout/groups", 0) < 1],
            "logged_steps": [r["step"] for _, r in watch.records],
            "resilience": summary.get("resilience"), "log": str(log), "run_dir": str(run_dir)}


def _costs(kills: list[dict[str, Any]], records: list[tuple[float, dict]]) -> list[dict[str, Any]]:
    """Per kill, against the median undisturbed step: the span from the last step logged before the kill
    to the first new step logged after the child was back, the steps that span gained, its cost in wall
    time (span - median x steps gained) and the steps logged again (a resumed trainer redoing them)."""
    seen = [t for t, _ in records]
    spans = []
    for k in kills:
        previous = max((t for t in seen if t <= k["t_kill"]), default=k["t_kill"])
        done = next(((t, r) for t, r in records if t > k["t_back"] and r["step"] > k["step_at_kill"]), None)
        spans.append((previous, done))
    disturbed = [(a, d[0]) for a, d in spans if d is not None]
    clean = [b - a for a, b in zip(seen, seen[1:], strict=False)
             if not any(lo <= a < hi for lo, hi in disturbed)]
    median = statistics.median(clean) if clean else 0.0
    out = []
    for k, (previous, done) in zip(kills, spans, strict=True):
        row: dict[str, Any] = {"child": k["child"], "outage_s": k["outage_s"], "step_hit": k["step_at_kill"] + 1,
                               "steps_redone": sum(1 for t, r in records
                                                   if t > k["t_kill"] and r["step"] <= k["step_at_kill"])}
        if done is not None:
            gained = int(done[1]["step"]) - k["step_at_kill"]
            row.update(span_s=round(done[0] - previous, 2), steps_gained=gained,
                       wall_cost_s=round(max(0.0, done[0] - previous - median * gained), 2))
        out.append(row)
    return out + [{"median_clean_step_s": round(median, 2)}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--backoff", type=float, default=3.0, help="the launcher's restart backoff (s)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evolver-chaos-") as tmp:
        result = run_chaos(Path(tmp), steps=args.steps, model=args.model, backoff_s=args.backoff)
        result.pop("log"), result.pop("run_dir")
    emit(result, args.out)
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
