"""The paper-shaped ablation: what each self-evolving mechanism adds, on held-out test tasks, paired per task.

    .venv/bin/python benchmarks/ablation.py --protocol examples/ablation/flights.yaml            # every row x seed
    .venv/bin/python benchmarks/ablation.py --protocol examples/ablation/flights.yaml --rows full --seeds 0
    .venv/bin/python benchmarks/ablation.py --protocol examples/ablation/flights.yaml --explore   # validation only
    .venv/bin/python benchmarks/ablation.py --report --results-dir benchmarks/results/ablation/flights

Rows (AgentEvolver's table, arXiv 2511.10395): `base` (no training), `q` (+Q: trains only on the tasks the
task manager synthesized, `use_original: false`, synthetic ratio 1), `qn` (+Q&N: and experience), `qa`
(+Q&A: and the judge with ADCA-GRPO), `full` (all three), and `grpo` (plain GRPO on the environment's own
train split). Every row's run YAML is derived from the protocol file's `run` section, which is the `full`
row: the derivation only switches mechanisms off (see `derive`), so the rows differ in nothing else.

Each (row, seed) run is `python launcher.py` as a child process, with a checkpoint every step and
`launcher.resume: true`: rerunning the same command after an interruption continues from the last
checkpoint (a finished run is not trained again). A run whose trainer stopped it as collapsed (exit 4, its
summary.json names the signal) is never resumed: it is recorded as failed (`failed` in its raw JSON, no
evaluation) and listed under the report's table. Its training curve is the trainer's greedy evaluation
on a small validation subset after every step. Then its final checkpoint is evaluated on the test split
(k samples per task at a fixed temperature) by `python -m trainer.evaluate` as a child process, against an
env service of its own: the in-process policy alone, no experience manager, no grammar, the same prompts
as the start evaluation (checked by digest).
The start evaluation (the base model) is computed once per seed, written as the `base` row, and reused
by every row of that seed. Raw JSON per run: `<results-dir>/<row>-seed<S>.json`; `--report` turns those
files (and nothing else) into REPORT.md and ablation.png. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.config import ConfigError, StrictModel, compose  # noqa: E402
from evolver_launcher.manifest import git_state  # noqa: E402
from evolver_launcher.supervisor import COLLAPSED_EXIT  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
Row = Literal["base", "q", "qn", "qa", "full", "grpo"]
ROWS: tuple[str, ...] = ("base", "q", "qn", "qa", "full", "grpo")
# The mechanisms each trained row keeps on top of self-questioning (`grpo` has none of the three).
MECHANISMS: dict[str, set[str]] = {"q": set(), "qn": {"experience"}, "qa": {"judge"},
                                   "full": {"experience", "judge"}, "grpo": set()}


class EvalProtocol(StrictModel):
    """The start and end evaluation: the test split, k samples per task at one fixed temperature."""

    split: Literal["test", "validation"] = "test"
    tasks: int = Field(default=64, ge=1, description="the first N task ids of the split")
    k: int = Field(default=4, ge=1)
    temperature: float = Field(default=0.7, gt=0)
    concurrency: int = Field(default=32, ge=1, description="episodes in flight (their generations batch)")


class CurveProtocol(StrictModel):
    """The training curve: the trainer's greedy avg@1 on the first `tasks` validation tasks."""

    tasks: int = Field(default=16, ge=1)
    every: int = Field(default=1, ge=1)


class AblationSettings(StrictModel):
    frozen: bool = Field(default=False, description="true once every setting was chosen on validation; "
                                                     "the test split is evaluated only then")
    seeds: list[int] = Field(min_length=1, description="fixed before the first run")
    rows: list[Row] = Field(default_factory=lambda: list(ROWS))
    eval: EvalProtocol = Field(default_factory=EvalProtocol)
    curve: CurveProtocol = Field(default_factory=CurveProtocol)
    target_delta: float = Field(default=0.10, gt=0, description="steps to target: the curve reaches base + this")
    run_timeout_min: float = Field(default=45.0, gt=0, description="one (row, seed) training run")
    eval_threads: int = Field(default=2, ge=1, description="torch threads of the evaluations")


class Protocol(StrictModel):
    ablation: AblationSettings
    run: dict[str, Any] = Field(description="the `full` row's launcher YAML; every row is derived from it")


def load_protocol(path: Path) -> Protocol:
    protocol = Protocol.model_validate(compose(path))
    services = set((protocol.run.get("launcher") or {}).get("services") or [])
    missing = {"env_service", "task_manager", "experience_manager", "judge"} - services
    if missing:
        raise ConfigError(f"run.launcher.services: the full row needs every mechanism; add {sorted(missing)}")
    trainer = protocol.run.get("trainer") or {}
    if not (trainer.get("rollout") or {}).get("experience_ratio"):
        raise ConfigError("run.trainer.rollout.experience_ratio: the full row gives experience (set eta > 0)")
    if (trainer.get("advantage") or {}).get("estimator") != "adca_grpo":
        raise ConfigError("run.trainer.advantage.estimator: the full row uses the judge (adca_grpo)")
    rollout = trainer.get("rollout") or {}
    # trainer.evaluate (the start and end evaluations) has no flags for these: the in-run curve and the
    # evaluations would not see the same prompts or sampling.
    if rollout.get("template_options") or rollout.get("top_p", 1.0) != 1.0:
        raise ConfigError("run.trainer.rollout: template_options and top_p are not supported by the ablation's "
                          "evaluations; remove them")
    return protocol


def _needs_llm_server(cfg: dict[str, Any], services: set[str]) -> bool:
    """The bundled model server stays when a kept service or the trainer still calls it."""
    roles = (cfg.get("task_manager") or {}).get("llm") or {}
    policy = (cfg.get("trainer") or {}).get("policy") or {}
    return ("judge" in services or ("task_manager" in services and any(roles.values()))
            or policy.get("kind") == "endpoint")


def derive(run: dict[str, Any], row: str, seed: int, settings: AblationSettings, runs_dir: Path) -> dict[str, Any]:
    """One row's launcher YAML: the full row with mechanisms switched off, and the harness's fixed parts
    (seed, checkpoint every step, resume, the validation curve)."""
    if row not in MECHANISMS:
        raise ValueError(f"row {row!r} is not trained (rows: {', '.join(MECHANISMS)})")
    cfg = copy.deepcopy(run)
    launcher, trainer = cfg.setdefault("launcher", {}), cfg.setdefault("trainer", {})
    launcher.update(experiment=f"{row}-seed{seed}", runs_dir=str(runs_dir), resume=True)
    launcher.setdefault("studio", {})["enabled"] = False
    trainer["seed"] = seed
    trainer["checkpoint"] = {"every": 1, "keep": 2}
    trainer["eval"] = {"split": "validation", "tasks": settings.curve.tasks, "k": 1, "greedy": True,
                       "every": settings.curve.every, "before": False, "after": True}
    rollout, advantage = trainer.setdefault("rollout", {}), trainer.setdefault("advantage", {})
    mechanisms = MECHANISMS[row]
    if row == "grpo":  # the reference row: the environment's own train split, no task manager
        keep = {"env_service"}
        launcher["synthesis"] = {"episodes": 0}
        trainer["train_split"] = "train"
        trainer.pop("tasks", None)
    else:  # zero human data: only the synthesized tasks
        keep = {"env_service", "task_manager"}
        # update, not replace: `pool_share` stays, so every zero-human-data row trains on the same tasks
        cfg.setdefault("task_manager", {}).setdefault("mixture", {}).update(synthetic_ratio=1.0, use_original=False)
        trainer.setdefault("tasks", {})["synthetic_ratio"] = 1.0
    if "experience" in mechanisms:
        keep.add("experience_manager")
    else:
        rollout["experience_ratio"] = 0.0
        launcher.setdefault("synthesis", {})["seed_experience"] = False  # no pool to seed
    if "judge" in mechanisms:
        keep.add("judge")
    else:
        advantage["estimator"] = "grpo"
    if _needs_llm_server(cfg, keep):
        keep.add("llm_server")
    launcher["services"] = [s for s in launcher.get("services", []) if s in keep]
    launcher["ports"] = {s: p for s, p in (launcher.get("ports") or {}).items() if s in keep}
    return cfg


# ---------------------------------------------------------------------------------------------- running


class Harness:
    def __init__(self, protocol_path: Path, protocol: Protocol, results_dir: Path, runs_dir: Path, *,
                 explore: bool) -> None:
        self.protocol_path, self.protocol = protocol_path, protocol
        self.settings = protocol.ablation
        self.results_dir, self.runs_dir, self.explore = results_dir, runs_dir.resolve(), explore
        self.eval = self.settings.eval.model_copy(update={"split": "validation"}) if explore else self.settings.eval
        self.protocol_sha = hashlib.sha256(protocol_path.read_bytes()).hexdigest()
        self.git = git_state(REPO)
        self._env_url: str | None = None
        self._stack = ExitStack()

    # -- the shared env service of the evaluations (the runs start their own through the launcher)

    def env_url(self) -> str:
        if self._env_url is None:
            from tests.helpers import run_service

            conf = self.runs_dir / "eval-env.yaml"
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(yaml.safe_dump({"env_service": self.protocol.run.get("env_service") or {}}))
            self._env_url = self._stack.enter_context(
                run_service("env_service", ["--conf", str(conf)], log_dir=self.runs_dir / "logs")).url
        return self._env_url

    def close(self) -> None:
        self._stack.close()

    def meta(self, row: str, seed: int) -> dict[str, Any]:
        return {"benchmark": "ablation", "row": row, "seed": seed, "git": self.git,
                "protocol": {"path": str(self.protocol_path), "sha256": self.protocol_sha,
                             "frozen": self.settings.frozen},
                "explore": self.explore, "eval_protocol": self.eval.model_dump(),
                "curve_protocol": self.settings.curve.model_dump(), "target_delta": self.settings.target_delta}

    def evaluate(self, policy: list[str], *, split: str, tasks: int, k: int, sample: bool, seed: int) -> dict:
        """`python -m trainer.evaluate` as a child (its model's memory is gone before the next training run):
        the in-process policy alone, no experience, no grammar."""
        rollout = self.protocol.run["trainer"]["rollout"]
        argv = ["--env", rollout["env"], "--split", split, "--tasks", str(tasks), "--k", str(k), "--seed", str(seed),
                "--template", rollout.get("template", "linear"), "--max-turns", str(rollout.get("max_turns", 8)),
                "--max-new-tokens", str(rollout.get("max_new_tokens", 128)),
                "--max-context", str(rollout.get("max_context", 2048)),
                "--concurrency", str(self.eval.concurrency), "--threads", str(self.settings.eval_threads)]
        if sample:
            argv += ["--sample", "--temperature", str(self.eval.temperature)]
        out = self.runs_dir / "evaluations" / f"{hashlib.sha256(json.dumps([policy, argv]).encode()).hexdigest()[:12]}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}
        started = time.monotonic()
        with out.with_suffix(".log").open("wb") as log:
            code = subprocess.run([sys.executable, "-m", "trainer.evaluate", "--env-url", self.env_url(), *argv, *policy,
                                   "--out", str(out)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise SystemExit(f"ablation: the evaluation failed (exit {code}); see {out.with_suffix('.log')}")
        return {**json.loads(out.read_text()), "argv": argv, "seconds": round(time.monotonic() - started, 1)}

    def result_path(self, row: str, seed: int) -> Path:
        return self.results_dir / f"{row}-seed{seed}.json"

    def write(self, row: str, seed: int, payload: dict[str, Any]) -> Path:
        path = self.result_path(row, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(path)
        return path

    # -- base: the start evaluation of a seed, shared by every row of it

    def base(self, seed: int) -> dict[str, Any]:
        path = self.result_path("base", seed)
        if path.is_file():
            return json.loads(path.read_text())
        model = ["--model", self.protocol.run["trainer"].get("model", "smollm2")]
        start = self.evaluate(model, split=self.eval.split, tasks=self.eval.tasks, k=self.eval.k, sample=True,
                              seed=seed)
        curve = self.evaluate(model, split="validation", tasks=self.settings.curve.tasks, k=1, sample=False,
                              seed=seed)
        payload = {**self.meta("base", seed), "eval_start": start, "curve_start": curve}
        self.write("base", seed, payload)
        return payload

    # -- one trained row

    def run_dir(self, row: str, seed: int) -> Path:
        return self.runs_dir / f"{row}-seed{seed}"

    def train(self, row: str, seed: int) -> tuple[Path, float]:
        """Train (or continue) one run through the launcher; returns its trainer folder and the wall time."""
        cfg = derive(self.protocol.run, row, seed, self.settings, self.runs_dir)
        run_dir = self.run_dir(row, seed)
        out = Path(cfg["trainer"].get("output_dir") or run_dir / "trainer")
        marker = run_dir.parent / f"{run_dir.name}.protocol"
        if marker.is_file() and marker.read_text().strip() != self.protocol_sha:
            raise SystemExit(f"ablation: {run_dir} was started under another protocol file; delete it (and "
                             f"{marker}) to start this run again")
        spent = run_dir.parent / f"{run_dir.name}.seconds"
        # A collapsed run is not resumed: training on would only go further from a degenerate policy.
        if _finished(out, cfg["trainer"]["steps"]) or collapse_of(out) is not None:
            return out, float(spent.read_text()) if spent.is_file() else 0.0
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(self.protocol_sha)
        conf = run_dir.parent / f"{run_dir.name}.yaml"
        conf.write_text(f"# Derived by benchmarks/ablation.py from {self.protocol_path} (row {row}, seed {seed}).\n"
                        + yaml.safe_dump(cfg, sort_keys=False))
        log = run_dir.parent / f"{run_dir.name}.launcher.log"
        started = time.monotonic()
        code = _run_launcher(conf, log, self.settings.run_timeout_min * 60)
        # Wall time over every launcher invocation of this run (an interrupted run is continued later).
        total = float(spent.read_text()) if spent.is_file() else 0.0
        spent.write_text(str(total + time.monotonic() - started))
        if code == COLLAPSED_EXIT and collapse_of(out) is not None:
            return out, float(spent.read_text())
        if code != 0 or not _finished(out, cfg["trainer"]["steps"]):
            tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
            raise SystemExit(f"ablation: {row} seed {seed}: the launcher ended with {code} before the last step; "
                             f"rerun the same command to continue from its last checkpoint. Log {log}:\n{tail}")
        return out, float(spent.read_text())

    def row(self, row: str, seed: int) -> dict[str, Any]:
        path = self.result_path(row, seed)
        if path.is_file():
            return json.loads(path.read_text())
        out, wall = self.train(row, seed)
        summary = json.loads((out / "summary.json").read_text())
        collapse = collapse_of(out)
        if collapse is not None:
            payload = {**self.meta(row, seed), "config": derive(self.protocol.run, row, seed, self.settings, self.runs_dir),
                       "failed": {"reason": "collapsed", "signal": collapse["signal"], "step": collapse["step"],
                                  "message": collapse["message"]},
                       "train": {"steps": summary["steps"], "wall_s": round(wall, 1), "collapse": collapse,
                                 "signal": summary.get("training"), "mechanisms": summary.get("mechanisms")}}
            self.write(row, seed, payload)
            return payload
        base = self.base(seed)
        from trainer.summary import interval

        records = _step_records(out / "metrics.jsonl")
        end = self.evaluate(["--checkpoint", str(out / "checkpoints")], split=self.eval.split,
                            tasks=self.eval.tasks, k=self.eval.k, sample=True, seed=seed)
        if end["argv"] != base["eval_start"]["argv"]:
            raise SystemExit("ablation: the end evaluation's settings differ from the start's")
        curve = [{"step": 0, "avg@1": base["curve_start"]["avg@1"]}]
        curve += [{"step": s, "avg@1": r["eval/avg@1"]} for s, r in records.items() if "eval/avg@1" in r]
        step_seconds = [r["time/step_s"] for r in records.values() if "time/step_s" in r]
        payload = {
            **self.meta(row, seed), "config": derive(self.protocol.run, row, seed, self.settings, self.runs_dir),
            "start_eval": f"base-seed{seed}.json (computed once per seed, shared by every row)",
            # wall_s: the training over every launcher invocation of this run
            "train": {"steps": summary["steps"], "wall_s": round(wall, 1), "step_s": step_seconds,
                      "curve": curve, "reward_per_step": [r.get("rollout/reward_mean") for r in records.values()],
                      "signal": summary.get("training"), "mechanisms": summary.get("mechanisms"),
                      "resumes": (summary.get("resilience") or {}).get("resumes"),
                      "dropped_groups": summary.get("dropped_groups")},
            "eval_end": end,
            "success_lengths": {"start": success_lengths(base["eval_start"]), "end": success_lengths(end)},
            "paired_vs_start": {m: interval(paired(base["eval_start"], end, m), (-1.0, 1.0))
                                for m in ("avg", "best")},
        }
        self.write(row, seed, payload)
        return payload


def per_task_metric(result: dict[str, Any], metric: str) -> dict[str, float]:
    """avg: the success share of a task's k samples; best: whether any succeeded (success = score 1)."""
    out = {}
    for task, scores in result["per_task"].items():
        success = [float(s >= 1.0) for s in scores]
        out[task] = sum(success) / len(success) if metric == "avg" else max(success)
    return out


def success_lengths(result: dict[str, Any]) -> dict[str, int] | None:
    """Successful samples by episode length (on a one-call lookup, length 1 is an answer without any call);
    None for an evaluation made before lengths were recorded."""
    steps = result.get("per_task_steps")
    if steps is None:
        return None
    counts: dict[str, int] = {}
    for task, scores in result["per_task"].items():
        for score, length in zip(scores, steps.get(task, []), strict=False):
            if score >= 1.0:
                counts[str(length)] = counts.get(str(length), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def paired(before: dict[str, Any], after: dict[str, Any], metric: str) -> list[float]:
    """After minus before, per task, over the tasks both evaluated with the same prompt."""
    a, b = per_task_metric(after, metric), per_task_metric(before, metric)
    differing = [t for t in a if t in b and before["prompts"].get(t) != after["prompts"].get(t)]
    if differing:
        raise ValueError(f"the prompts of {len(differing)} tasks differ between the evaluations (e.g. {differing[0]})")
    return [a[t] - b[t] for t in sorted(a) if t in b]


def collapse_of(out: Path) -> dict[str, Any] | None:
    """The trainer's collapse record when its summary.json says the run collapsed, else None."""
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return summary.get("collapse") if summary.get("status") == "collapsed" else None


def _finished(out: Path, steps: int) -> bool:
    from trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(out / "checkpoints")
    return (out / "summary.json").is_file() and latest is not None and latest.name == f"step_{steps:06d}.pt"


def _step_records(path: Path) -> dict[int, dict[str, Any]]:
    """Per training step its last metrics record (a step re-run after a resume counts once)."""
    records: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            record = json.loads(line)
            if record["step"] > 0:
                records[int(record["step"])] = record
    return dict(sorted(records.items()))


def _run_launcher(conf: Path, log: Path, timeout_s: float) -> int:
    """The launcher as a child; SIGTERM or Ctrl-C here stops it cleanly (it stops its own children)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as sink:
        proc = subprocess.Popen([sys.executable, str(REPO / "launcher.py"), "--conf", str(conf)], cwd=REPO, env=env,
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()  # the launcher's SIGTERM path stops the services and Ray, then exits
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _committed(path: Path) -> bool:
    """The protocol file is in git and unchanged since the commit the results record."""
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "--error-unmatch", str(path.resolve())],
                             capture_output=True).returncode == 0
    clean = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD", "--", str(path.resolve())],
                           capture_output=True).returncode == 0
    return tracked and clean


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/ablation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", type=Path, help="the frozen protocol YAML (examples/ablation/*.yaml)")
    parser.add_argument("--rows", default=None, help="comma-separated subset of the protocol's rows")
    parser.add_argument("--seeds", default=None, help="comma-separated subset of the protocol's seeds")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="raw JSON per run (default benchmarks/results/ablation/<protocol name>[/explore])")
    parser.add_argument("--runs-dir", type=Path, default=None, help="run folders (default runs/ablation/<name>)")
    parser.add_argument("--explore", action="store_true",
                        help="evaluate on the validation split instead of test (choosing the protocol)")
    parser.add_argument("--allow-uncommitted", action="store_true",
                        help="evaluate on test although the protocol file is not committed (tests only)")
    parser.add_argument("--report", action="store_true", help="REPORT.md and ablation.png from --results-dir")
    args = parser.parse_args(argv)

    if args.report:
        from benchmarks.ablation_report import write_report

        if args.results_dir is None:
            parser.error("--report needs --results-dir")
        print(json.dumps(write_report(args.results_dir)))
        return 0
    if args.protocol is None:
        parser.error("give --protocol (or --report)")
    try:
        protocol = load_protocol(args.protocol)
    except (ConfigError, ValueError) as exc:
        print(f"ablation: {args.protocol}: {exc}", file=sys.stderr)
        return 2
    settings = protocol.ablation
    if not args.explore and not settings.frozen:
        print("ablation: the protocol is not frozen (ablation.frozen: false); choose its settings with --explore "
              "on the validation split, then freeze and commit it before touching the test split", file=sys.stderr)
        return 2
    if not args.explore and not args.allow_uncommitted and not _committed(args.protocol):
        print(f"ablation: commit {args.protocol} first: the results record the commit it was frozen in",
              file=sys.stderr)
        return 2
    rows = args.rows.split(",") if args.rows else list(settings.rows)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(settings.seeds)
    unknown = [r for r in rows if r not in settings.rows] + [str(s) for s in seeds if s not in settings.seeds]
    if unknown:
        print(f"ablation: {', '.join(unknown)}: not in the protocol (rows {settings.rows}, seeds {settings.seeds})",
              file=sys.stderr)
        return 2
    name = args.protocol.stem
    results_dir = args.results_dir or REPO / "benchmarks" / "results" / "ablation" / name / (
        "explore" if args.explore else "")
    runs_dir = args.runs_dir or REPO / "runs" / "ablation" / (f"{name}-explore" if args.explore else name)
    harness = Harness(args.protocol, protocol, results_dir, runs_dir, explore=args.explore)
    done: list[str] = []
    try:
        for seed in seeds:  # a seed's rows share its start evaluation
            for row in rows:
                payload = harness.base(seed) if row == "base" else harness.row(row, seed)
                done.append(str(harness.result_path(row, seed)))
                if "failed" in payload:
                    print(f"[ablation] {row} seed {seed}: FAILED, recorded as such and not resumed: "
                          f"{payload['failed']['message']}", file=sys.stderr, flush=True)
                elif row != "base":
                    delta = payload["paired_vs_start"]["avg"]
                    print(f"[ablation] {row} seed {seed}: avg@{settings.eval.k} change {delta['mean']:+.3f} "
                          f"[{delta['lo']:+.3f}, {delta['hi']:+.3f}]", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("ablation: interrupted; the same command continues from the last checkpoints", file=sys.stderr)
        return 130
    finally:
        harness.close()
    print(json.dumps({"benchmark": "ablation", "protocol": str(args.protocol), "results": done,
                      "commit": harness.git.get("commit")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
