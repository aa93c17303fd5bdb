"""Soak: a long launcher run under repeated SIGKILLs; RSS, descriptors and every acknowledged write watched.

    .venv/bin/python benchmarks/services/soak.py [--minutes 45] [--seed 0] [--kills 3]
        [--workdir DIR] [--out benchmarks/results/soak.json] [--png benchmarks/results/soak-rss.png]

Runs `launcher.py` with the tiny model and everything on: flights, all five services, Ray (the trainer runs in a
Ray actor), ADCA-GRPO with the judge, the collapse guard off (a tiny random policy's noise trips it), experience
for half of each group with in-run summaries (the pool grows), a synthesis job on the task manager whenever none is
running, a checkpoint every step. A seeded scheduler SIGKILLs each service, the trainer and the trainer's Ray
worker (`ray::TrainerActor`) `--kills` times each: target t's i-th kill falls at a random time in the i-th of
`--kills` equal parts of the run, so kills of one target are spread out, and kills are one at a time (the next
waits until the last target is back). The launcher's restart budget is the default (2 restarts per child within 600
s) when a part is at least 600 s long (`--minutes 45` and more), else a window of 90% of a part.

Every minute (`--sample-s`) it samples each child's processes (the child and its descendants; Ray's
`ray::` workers counted apart) for RSS and open descriptors, and reads back what the services and the
trainer acknowledged, into a ledger: experience ids (plus a probe experience it writes itself each minute
and right before the experience manager is killed), task ids with their recorded rollouts, the trainer's
rollout index (each entry must point at a readable record), the judge's audited labels (request and
trajectory ids). At the end, while the run still goes, everything in the ledger is read again: nothing may
be missing (entries of rollout shards the trainer rotated away by design are counted apart).

It writes as it goes to `<workdir>/soak-events.jsonl` (samples, kills, ledger sizes), so an interrupted soak
still leaves its record, and always stops the launcher it started. Prints one JSON line: minutes run, kills
per target (each survived), steps lost per kill (steps the trainer logged again after it, before the next
kill), RSS and descriptors per process at the baseline minute (10, or a third of a shorter run) and at the
end with the growth (`same_process`: false when a kill restarted it in between, so the growth spans two
processes), the ledger's sizes and what is missing; and draws RSS over time (PNG).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from benchmarks.harness import full_stack_config, start_launcher  # noqa: E402
from tests.helpers import stop_group  # noqa: E402

SERVICES = ("env_service", "experience_manager", "task_manager", "judge", "llm_server")
TARGETS = (*SERVICES, "trainer", "ray_worker")
TRAINER_ACTOR = "ray::TrainerActor"
DEFAULT_WINDOW_S = 600.0
BACK_TIMEOUT_S = 600.0
KILL_GAP = 0.55  # of the restart window: the least time between two kills of one target



# ---------------------------------------------------------------- the schedule


def kill_schedule(seed: int, kills: int, start_s: float, end_s: float) -> list[tuple[float, str]]:
    """(seconds from the start, target): target t's i-th kill at a random time in the i-th part of the span."""
    rng = random.Random(seed)
    part = (end_s - start_s) / kills
    plan = [(start_s + i * part + rng.uniform(0.05, 0.95) * part, target)
            for i in range(kills) for target in TARGETS]
    return sorted(plan)


def restart_window(kills: int, start_s: float, end_s: float) -> float:
    part = (end_s - start_s) / kills
    return DEFAULT_WINDOW_S if part >= DEFAULT_WINDOW_S else round(0.9 * part, 1)


# ---------------------------------------------------------------- the run's processes


def child_pids(log: Path) -> dict[str, int]:
    """The newest pid the launcher started for each child (its log says `started <name> ... (pid N`)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    return {name: int(pid) for name, pid in re.findall(r"started (\w+)(?: on port \d+)? \(pid (\d+)", text)}


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def process_name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def trainer_actor(pids: dict[str, int]) -> psutil.Process | None:
    """The Ray worker that hosts the trainer's actor (a descendant of the Ray head's raylet)."""
    for proc in tree(pids.get("ray", -1)):
        if process_name(proc).startswith(TRAINER_ACTOR):
            return proc
    return None


def sample_processes(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """RSS (MiB) and open descriptors per child's process tree; Ray's `ray::` workers under their own key."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"rss_mb": 0.0, "fds": 0, "processes": 0})
    for name, pid in pids.items():
        out[name]["pid"] = pid  # a restarted child is a new process: its growth starts again
        for proc in tree(pid):
            key = "ray_workers" if process_name(proc).startswith("ray::") else name
            try:
                with proc.oneshot():
                    rss, fds = proc.memory_info().rss, proc.num_fds()
            except psutil.Error:
                continue
            out[key]["rss_mb"] += rss / 2**20
            out[key]["fds"] += fds
            out[key]["processes"] += 1
    return {k: {**v, "rss_mb": round(v["rss_mb"], 1)} for k, v in out.items()}


# ---------------------------------------------------------------- the ledger


def complete_lines(path: Path) -> list[dict]:
    """The records of a JSONL file that a writer finished (a line being written, or torn, is skipped)."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    records = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"unreadable": line[:200].decode(errors="replace")})
    return records


class Ledger:
    """Everything acknowledged so far, and the checks that it is all still there."""

    def __init__(self, run_dir: Path, urls: dict[str, str], workspace: str) -> None:
        self.run_dir, self.urls, self.workspace = run_dir, urls, workspace
        self.http = httpx.Client(timeout=60, trust_env=False)
        self.experiences: set[str] = set()
        self.tasks: dict[str, int] = {}
        self.rollouts: dict[str, str] = {}  # trajectory id -> its shard
        self.labels: set[tuple[str, str]] = set()  # (request id, trajectory id) in the judge's audit

    def sizes(self) -> dict[str, int]:
        return {"experiences": len(self.experiences), "tasks": len(self.tasks), "rollouts": len(self.rollouts),
                "labels": len(self.labels)}

    def prefix_cache_mb(self) -> float | None:
        """What llm_server's kept caches hold now (MiB); None while it restarts."""
        try:
            stats = self.http.get(f"{self.urls['llm_server']}/v1/stats", timeout=10).json()
            return round(stats["prefix_cache_bytes"] / 2**20, 1)
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    def probe(self) -> str:
        """One experience the manager acknowledges now."""
        body = {"when_to_use": f"soak probe {uuid.uuid4().hex[:8]}", "content": "written by the soak",
                "request_id": uuid.uuid4().hex}
        response = self.http.post(f"{self.urls['experience_manager']}/v1/workspaces/{self.workspace}/experiences",
                                  json=body)
        response.raise_for_status()
        experience_id = response.json()["experience"]["experience_id"]
        self.experiences.add(experience_id)
        return experience_id

    def experience_ids(self) -> set[str]:
        ids: set[str] = set()
        while True:
            page = self.http.get(f"{self.urls['experience_manager']}/v1/workspaces/{self.workspace}/experiences",
                                 params={"status": "all", "offset": len(ids), "limit": 500}).json()
            batch = {e["experience_id"] for e in page.get("experiences", [])}
            ids |= batch
            if len(batch) < 500:
                return ids

    def task_rollouts(self) -> dict[str, int]:
        url = self.urls["task_manager"]
        tasks = self.http.get(f"{url}/v1/tasks", params={"limit": 5000}).json()["tasks"]
        return {t["task_id"]: int(self.http.get(f"{url}/v1/tasks/{t['task_id']}", params={"env": t["env_type"]})
                                  .json().get("rollouts", 0)) for t in tasks}

    def rollout_index(self) -> list[dict]:
        return complete_lines(self.run_dir / "trainer" / "rollouts" / "index.jsonl")

    def audit(self) -> list[dict]:
        return complete_lines(self.run_dir / "judge" / "audit.jsonl")

    def read(self, only: str | None = None) -> None:
        """Add what is acknowledged now; `only` limits it to one service's part."""
        if only in (None, "experience_manager"):
            self.experiences |= self.experience_ids()
        if only in (None, "task_manager"):
            for task_id, rollouts in self.task_rollouts().items():
                self.tasks[task_id] = max(rollouts, self.tasks.get(task_id, 0))
        if only is None:
            self.rollouts.update({e["trajectory_id"]: e["shard"] for e in self.rollout_index() if "shard" in e})
            self.labels |= {(r["request_id"], r["trajectory_id"]) for r in self.audit() if "trajectory_id" in r}

    def missing(self) -> dict[str, Any]:
        """What the ledger holds that cannot be read back now."""
        experiences = sorted(self.experiences - self.experience_ids())
        now = self.task_rollouts()
        tasks = sorted(f"{t} (rollouts {n} -> {now.get(t)})" for t, n in self.tasks.items() if now.get(t, -1) < n)
        rollouts_dir = self.run_dir / "trainer" / "rollouts"
        shards = sorted(rollouts_dir.glob("shard-*.jsonl"))
        oldest = shards[0].name if shards else ""
        index = {e["trajectory_id"]: e for e in self.rollout_index() if "trajectory_id" in e}
        unreadable = [e for e in self.rollout_index() if "unreadable" in e]
        rotated = {t for t, shard in self.rollouts.items() if shard < oldest}
        rollouts = []
        for trajectory_id in sorted(set(self.rollouts) - rotated):
            entry = index.get(trajectory_id)
            if entry is None or not _record_readable(rollouts_dir, entry):
                rollouts.append(trajectory_id)
        audited = {(r["request_id"], r["trajectory_id"]) for r in self.audit() if "trajectory_id" in r}
        labels = sorted(f"{r}/{t}" for r, t in self.labels - audited)
        return {"experiences": experiences, "tasks": tasks, "rollouts": rollouts, "labels": labels,
                "unreadable_index_lines": len(unreadable), "rollouts_rotated_away": len(rotated)}


def _record_readable(directory: Path, entry: dict) -> bool:
    try:
        with (directory / entry["shard"]).open("rb") as f:
            f.seek(entry["offset"])
            return json.loads(f.read(entry["length"]))["trajectory_id"] == entry["trajectory_id"]
    except (OSError, ValueError, KeyError):
        return False


# ---------------------------------------------------------------- the soak


class Soak:
    def __init__(self, workdir: Path, *, minutes: float, seed: int, kills: int, model: str,
                 sample_s: float) -> None:
        self.workdir, self.minutes, self.seed, self.kills, self.model = workdir, minutes, seed, kills, model
        self.sample_s = sample_s
        self.run_dir = workdir / "runs" / "soak"
        self.log = workdir / "launcher.out"
        self.events_path = workdir / "soak-events.jsonl"
        self.samples: list[dict[str, Any]] = []
        self.kill_log: list[dict[str, Any]] = []
        self.steps: list[int] = []  # the step of every metrics record, in the file's order
        self._metrics_seen = 0
        self.proc: subprocess.Popen | None = None
        self.t0 = time.monotonic()

    # -------------------------------------------------------- bookkeeping

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, kind: str, **fields: Any) -> None:
        with self.events_path.open("a") as f:
            f.write(json.dumps({"t": round(self.now(), 1), "event": kind, **fields}) + "\n")

    def poll_steps(self) -> int:
        records = complete_lines(self.run_dir / "trainer" / "metrics.jsonl")
        for record in records[self._metrics_seen:]:
            if "step" in record:
                self.steps.append(int(record["step"]))
        self._metrics_seen = len(records)
        return self.steps[-1] if self.steps else 0

    def check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the launcher exited ({self.proc.returncode}):\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}")

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll_steps()
            if predicate():
                return
            self.check_alive()
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {timeout:.0f}s")

    # -------------------------------------------------------- the run

    def start(self, window_s: float) -> None:
        conf = self.workdir / "soak.yaml"
        config = full_stack_config(experiment="soak", runs=self.workdir / "runs", model=self.model)
        config["launcher"].update(restart={"max_restarts": 2, "window_s": window_s, "backoff_s": 1.0, "trainer": True},
                                  ray={"enabled": True, "dashboard": False, "num_cpus": 2})
        # The tiny random policy's invalid-action rate drifts by chance over hundreds of steps, which the collapse
        # guard (a learning-quality stop, exit 4) reads as a collapse: the soak tests survival, not learning.
        config["trainer"].update(seed=self.seed, steps=1000000, experience={"summarize": True, "feedback": True},
                                 collapse={"enabled": False})
        conf.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc = start_launcher(conf, self.log)
        self.event("started", pid=self.proc.pid, window_s=window_s)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        stop_group(self.proc, signal.SIGINT, 120, kill_timeout=30)
        self.event("stopped", code=self.proc.returncode)
        return self.proc.returncode

    def urls(self) -> tuple[dict[str, str], str]:
        data = yaml.safe_load((self.run_dir / "config.yaml").read_text())
        workspace = (data["trainer"].get("experience") or {}).get("workspace", "default")
        return {name: f"http://127.0.0.1:{data[name]['port']}" for name in SERVICES}, workspace

    def keep_synthesizing(self, ledger: Ledger, job: dict[str, Any]) -> None:
        """A synthesis job whenever none runs (the task manager resumes a job it was killed in)."""
        url = ledger.urls["task_manager"]
        if job.get("id"):
            status = ledger.http.get(f"{url}/v1/jobs/{job['id']}").json().get("status")
            if status in ("queued", "running"):
                return
        job["n"] = job.get("n", 0) + 1
        body = {"env": "flights", "episodes": 8, "seed": self.seed * 1000 + job["n"]}
        job["id"] = ledger.http.post(f"{url}/v1/jobs", json=body).json()["job_id"]
        self.event("synthesis_job", job_id=job["id"])

    def sample(self, ledger: Ledger) -> None:
        processes = sample_processes(child_pids(self.log))
        try:
            ledger.read()
            ledger.probe()
            error = None
        except (httpx.HTTPError, ValueError, KeyError) as exc:  # a service mid-restart: next minute
            error = f"{type(exc).__name__}: {exc}"
        row = {"t": round(self.now(), 1), "step": self.poll_steps(), "processes": processes,
               "ledger": ledger.sizes(), "ledger_error": error}
        if "llm_server" in processes:  # its kept caches grow by design up to llm_server.prefix_cache_mb
            processes["llm_server"]["prefix_cache_mb"] = ledger.prefix_cache_mb()
        self.samples.append(row)
        self.event("sample", **{k: v for k, v in row.items() if k != "t"})

    def kill(self, target: str, ledger: Ledger) -> dict[str, Any]:
        pids = child_pids(self.log)
        try:
            if target == "experience_manager":
                ledger.probe()  # acknowledged right before the kill
            if target in ("experience_manager", "task_manager"):
                ledger.read(only=target)
        except (httpx.HTTPError, ValueError, KeyError) as exc:  # the kill goes ahead; the ledger has the rest
            self.event("ledger_error", target=target, error=f"{type(exc).__name__}: {exc}")
        if target == "ray_worker":
            actor = trainer_actor(pids)
            if actor is None:
                raise RuntimeError(f"no {TRAINER_ACTOR} process under the Ray head")
            pid = actor.pid
        else:
            pid = pids[target]
        trainer_pid = pids.get("trainer")
        step_at_kill, t_kill, records_at_kill = self.poll_steps(), self.now(), len(self.steps)
        os.kill(pid, signal.SIGKILL)
        # The trainer's Ray worker dies with the trainer's driver: both come back as a new trainer.
        name = "trainer" if target == "ray_worker" else target
        old = trainer_pid if target == "ray_worker" else pid
        url = ledger.urls.get(name)

        def back() -> bool:
            new = child_pids(self.log).get(name)
            if new is None or new == old:
                return False
            if url is None:
                return True
            try:
                return ledger.http.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait(back, BACK_TIMEOUT_S, f"{target} back")
        t_back = self.now()
        self.wait(lambda: self.poll_steps() > step_at_kill, BACK_TIMEOUT_S, f"a new step after the {target} kill")
        row = {"target": target, "pid": pid, "t_kill": round(t_kill, 1), "t_back": round(t_back, 1),
               "outage_s": round(t_back - t_kill, 1), "step_at_kill": step_at_kill, "records_at_kill": records_at_kill,
               "survived": True}
        self.kill_log.append(row)
        self.event("kill", **row)
        return row

    def run(self) -> dict[str, Any]:
        end_s = self.minutes * 60
        first_kill_s = min(120.0, end_s * 0.15)
        last_kill_s = end_s - min(180.0, end_s * 0.2)
        window_s = restart_window(self.kills, first_kill_s, last_kill_s)
        schedule = kill_schedule(self.seed, self.kills, first_kill_s, last_kill_s)
        self.event("schedule", kills=[[round(t, 1), target] for t, target in schedule])
        error = None
        ledger: Ledger | None = None
        missing: dict[str, Any] | None = None
        self.start(window_s)
        try:
            self.wait(lambda: "all services healthy" in self.log.read_text(errors="replace"), 900,
                      "all services healthy")
            self.wait(lambda: self.poll_steps() >= 1, 900, "the first step")
            self.t0 = time.monotonic()  # the soak's minutes count from the first step
            urls, workspace = self.urls()
            ledger = Ledger(self.run_dir, urls, workspace)
            job: dict[str, Any] = {}
            last_kill: dict[str, float] = {}
            next_sample = 0.0
            while self.now() < end_s or schedule:  # kills wait for each other: the last ones may run late
                self.check_alive()
                if self.now() >= next_sample:
                    try:
                        self.keep_synthesizing(ledger, job)
                    except (httpx.HTTPError, ValueError, KeyError) as exc:  # mid-restart: next minute
                        self.event("synthesis_error", error=f"{type(exc).__name__}: {exc}")
                    self.sample(ledger)
                    next_sample += self.sample_s
                if schedule and self.now() >= schedule[0][0]:
                    when, target = schedule.pop(0)
                    # Kills wait for each other, so late ones bunch up: keep one target's kills apart, so
                    # three never fall within one restart window (that would be a crash loop, and stop the run).
                    earliest = last_kill.get(target, -window_s) + KILL_GAP * window_s
                    if self.now() < earliest:
                        schedule = sorted([*schedule, (earliest, target)])
                        continue
                    self.kill(target, ledger)
                    last_kill[target] = self.now()
                    continue
                self.poll_steps()
                time.sleep(0.5)
            self.sample(ledger)
            ledger.read()
            missing = ledger.missing()
        except BaseException as exc:  # noqa: BLE001 (an interrupted soak still reports what it saw)
            error = f"{type(exc).__name__}: {exc}"
            self.event("error", error=error)
        finally:
            code = self.stop()
        return self.report(code, error, window_s, ledger, missing)

    # -------------------------------------------------------- the report

    def report(self, code: int | None, error: str | None, window_s: float, ledger: Ledger | None,
               missing: dict[str, Any] | None) -> dict[str, Any]:
        kills_by_target = {t: sum(1 for k in self.kill_log if k["target"] == t) for t in TARGETS}
        steps_lost = []
        for k, after in zip(self.kill_log, [*self.kill_log[1:], None], strict=True):
            # Steps logged again after this kill (and before the next one, which answers for its own).
            logged_after = self.steps[k["records_at_kill"]: after["records_at_kill"] if after else None]
            redone = sorted({s for s in logged_after if s <= k["step_at_kill"]})
            steps_lost.append({"target": k["target"], "step_at_kill": k["step_at_kill"], "steps_lost": len(redone),
                               "outage_s": k["outage_s"]})
        minutes_run = round(self.now() / 60, 1) if self.samples else 0.0
        baseline_t = min(600.0, self.minutes * 60 / 3)
        growth = resource_growth(self.samples, baseline_t)
        missing_count = (sum(len(v) for k, v in missing.items() if isinstance(v, list)) if missing else None)
        return {
            "minutes_run": minutes_run, "minutes_asked": self.minutes, "seed": self.seed, "model": self.model,
            "completed": error is None, "error": error, "launcher_exit_code": code,
            "restart_policy": {"max_restarts": 2, "window_s": window_s},
            "steps": self.steps[-1] if self.steps else 0,
            "kills_per_target": kills_by_target,
            "all_kills_survived": all(k["survived"] for k in self.kill_log) and error is None,
            "steps_lost_per_kill": steps_lost,
            "baseline_minute": round(baseline_t / 60, 1), "resources": growth,
            "rss_growth_max_pct": max((g["rss_growth_pct"] for g in growth.values()
                                       if g.get("rss_growth_pct") is not None), default=None),
            "fds_growth_max_pct": max((g["fds_growth_pct"] for g in growth.values()
                                       if g.get("fds_growth_pct") is not None), default=None),
            "rss_growth_within_a_process_max_pct": max(
                (g["rss_growth_within_a_process_max_pct"] for g in growth.values()
                 if g.get("rss_growth_within_a_process_max_pct") is not None), default=None),
            "ledger": ledger.sizes() if ledger else None, "missing": missing, "missing_count": missing_count,
            "samples": len(self.samples), "workdir": str(self.workdir),
        }


def resource_growth(samples: list[dict[str, Any]], baseline_t: float) -> dict[str, dict[str, Any]]:
    """Per process key: RSS and descriptors at the first sample at or after `baseline_t` and at the last."""
    later = [s for s in samples if s["t"] >= baseline_t]
    if len(later) < 2:
        return {}
    first, last = later[0]["processes"], later[-1]["processes"]
    out = {}
    for key in sorted(set(first) | set(last)):
        a, b = first.get(key), last.get(key)
        row: dict[str, Any] = {"rss_mb_baseline": a and a["rss_mb"], "rss_mb_end": b and b["rss_mb"],
                               "fds_baseline": a and a["fds"], "fds_end": b and b["fds"]}
        row["rss_growth_pct"] = round(100 * (b["rss_mb"] / a["rss_mb"] - 1), 1) if a and b and a["rss_mb"] else None
        row["fds_growth_pct"] = round(100 * (b["fds"] / a["fds"] - 1), 1) if a and b and a["fds"] else None
        row["same_process"] = bool(a and b and "pid" in a and a.get("pid") == b.get("pid"))
        if a and b and a.get("prefix_cache_mb") is not None and b.get("prefix_cache_mb") is not None:
            # llm_server's RSS less what its kept caches hold: the growth a leak would show
            net_a, net_b = a["rss_mb"] - a["prefix_cache_mb"], b["rss_mb"] - b["prefix_cache_mb"]
            row["prefix_cache_mb_baseline"], row["prefix_cache_mb_end"] = a["prefix_cache_mb"], b["prefix_cache_mb"]
            row["rss_growth_net_of_prefix_cache_pct"] = round(100 * (net_b / net_a - 1), 1)
        row["rss_growth_within_a_process_max_pct"] = growth_within_a_process(samples, key)
        out[key] = row
    return out


def growth_within_a_process(samples: list[dict[str, Any]], key: str) -> float | None:
    """The largest RSS growth over one process's life (one pid), from its second sample (the first may still be
    starting) to its last; lives with fewer than three samples are skipped. A kill restarts a child, so this,
    not the baseline-to-end figure, is what shows a leak in a child killed during the soak."""
    lives: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        row = sample["processes"].get(key)
        if row and "pid" in row:
            lives[row["pid"]].append(row["rss_mb"])
    growths = [100 * (rss[-1] / rss[1] - 1) for rss in lives.values() if len(rss) >= 3 and rss[1]]
    return round(max(growths), 1) if growths else None


def draw_rss(samples: list[dict[str, Any]], kills: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for s in samples for k in s["processes"]})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key in keys:
        points = [(s["t"] / 60, s["processes"][key]["rss_mb"]) for s in samples if key in s["processes"]]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=key)
    for k in kills:
        ax.axvline(k["t_kill"] / 60, color="grey", alpha=0.6, linewidth=0.8, linestyle="--")
        ax.annotate(k["target"], (k["t_kill"] / 60, 1), xycoords=("data", "axes fraction"), rotation=90,
                    fontsize=6, va="top", ha="right", color="grey")
    ax.set_xlabel("minutes (grey: a SIGKILL)")
    ax.set_ylabel("RSS (MiB, process and descendants)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=45.0, help="length of the soak, from the first step")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill schedule and the run")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs per target")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--workdir", type=Path, help="the run folder, events and logs (default: a new temporary "
                                                       "folder, kept for inspection)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--png", type=Path, help="RSS over time (default: beside --out, else in the workdir)")
    args = parser.parse_args()
    if args.minutes <= 0 or args.kills < 1 or args.sample_s <= 0:
        parser.error("--minutes and --sample-s must be positive and --kills at least 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="evolver-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "runs").exists():
        parser.error(f"{workdir / 'runs'} exists: give a fresh --workdir (a soak never reuses a run folder)")
    soak = Soak(workdir, minutes=args.minutes, seed=args.seed, kills=args.kills, model=args.model,
                sample_s=args.sample_s)
    result = soak.run()
    png = args.png or (args.out.with_name(f"{args.out.stem}-rss.png") if args.out else workdir / "soak-rss.png")
    if soak.samples:
        draw_rss(soak.samples, soak.kill_log, png)
        result["png"] = str(png)
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    ok = result["completed"] and result["missing_count"] == 0 and result["all_kills_survived"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
