"""The paper-shaped ablation: what each self-evolving mechanism adds, on held-out test tasks, paired per task.

    .venv/bin/python benchmarks/science/ablation.py --protocol examples/ablation/flights.yaml            # every row x seed
    .venv/bin/python benchmarks/science/ablation.py --protocol examples/ablation/flights.yaml --rows full --seeds 0
    .venv/bin/python benchmarks/science/ablation.py --protocol examples/ablation/flights.yaml --explore   # validation only
    .venv/bin/python benchmarks/science/ablation.py --protocol examples/ablation/flights_v3.yaml --pilot  # v3's go/no-go
    .venv/bin/python benchmarks/science/ablation.py --report --results-dir benchmarks/results/ablation/flights

Rows (AgentEvolver's table, arXiv 2511.10395): `base` (no training), `q` (+Q: trains only on the tasks the
task manager synthesized, `use_original: false`, synthetic ratio 1), `qn` (+Q&N: and experience), `qa`
(+Q&A: and the judge with ADCA-GRPO), `full` (all three), and `grpo` (plain GRPO on the environment's own
train split). Every row's run YAML is derived from the protocol file's `run` section, which is the `full`
row: the derivation only switches mechanisms off (see `derive`), so the rows differ in nothing else.

v2 (`ablation.version: 2`, examples/ablation/flights_v2.yaml): the rows of `ROWS_V2` (benchmarks/science/ablation_common.py,
one table of what each switches on), on top of a warm start. The `run` section is the W+full row. The `w` row (the
warm start, 0 RL steps) runs once per seed; every W row with RL starts from its step-0 checkpoint
(`trainer.warm_start.from_checkpoint`: no second fine-tuning) and from a copy of its task store (the launcher's
synthesis finds the tasks there and makes none), and so does `full`, so every synthetic-task row of a seed trains on
the same synthetic tasks and pool. `env_n`'s pool is seeded from train-split references before its launch
(loop_probe's `--pool train`). The metric is strict avg@k (a success needs a tool call), and the report checks the
pre-registered criteria (benchmarks/science/ablation_criteria.py). Each v2 result records its minutes (train, eval, total)
and, from the run's rollout records, its mixed-outcome groups and A's room to act per task kind
(benchmarks/science/ablation_rollouts.py).

v3 (`ablation.version: 3`, examples/ablation/flights_v3.yaml): the rows of `ROWS_V3` on multi-call tasks, run as v2's;
with `ablation.forgetting` every run is also evaluated on other tiers (tier 1) after training, paired per task with
the base model there. `--pilot`: validation, the first seed, rows `w` and `w_q` (`--rows w,w_q,w_qa` adds A's room
to act), no forgetting evaluation. It trains every row before evaluating any (the mixed-outcome groups need no
evaluation), and after every training and every evaluation writes `pilot.json`, the go/no-go per kind
(benchmarks/science/ablation_pilot.py), so a pilot stopped early still leaves what it measured.

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
import asyncio
import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness import REPO  # noqa: E402
from benchmarks.science.ablation_common import (  # noqa: E402
    MECHANISMS_V1,
    ROW_SPECS,
    ROWS_V1,
    paired,
    per_task_metric,
    shares_task_store,
    shares_warm_start,
    success_lengths,
)
from benchmarks.science.ablation_common import ROWS as ROWS_BY_VERSION  # noqa: E402
from benchmarks.science.ablation_rollouts import rollout_stats  # noqa: E402
from common.config import ConfigError, StrictModel, compose  # noqa: E402
from evolver_launcher.manifest import git_state  # noqa: E402
from evolver_launcher.supervisor import COLLAPSED_EXIT  # noqa: E402

ROWS, MECHANISMS = ROWS_V1, MECHANISMS_V1  # the v1 protocol's rows (examples/ablation/flights.yaml)
__all__ = ["ROWS", "MECHANISMS", "derive", "load_protocol", "paired", "per_task_metric", "success_lengths"]


class EvalProtocol(StrictModel):
    """The start and end evaluation: the test split, k samples per task at one fixed temperature."""

    split: Literal["test", "validation"] = "test"
    tasks: int = Field(default=64, ge=1, description="the first N task ids of the split")
    k: int = Field(default=4, ge=1)
    temperature: float = Field(default=0.7, gt=0)
    concurrency: int = Field(default=32, ge=1, description=(
        "episodes in flight, and the rows the evaluating engine generates together"))


class CurveProtocol(StrictModel):
    """The training curve: the trainer's greedy avg@1 on the first `tasks` validation tasks, every `every`
    steps (and at the end); `enabled: false`: no curve (no in-run evaluation at all)."""

    enabled: bool = True
    tasks: int = Field(default=16, ge=1)
    every: int = Field(default=1, ge=1)


class EnvPoolProtocol(StrictModel):
    """The `env_n` row's pool: the first `per_kind` train tasks of every kind, their references replayed
    (benchmarks/science/loop_probe.py's `--pool train`)."""

    per_kind: int = Field(default=4, ge=1)
    demo_format: Literal["python", "tool_call"] = "python"
    obs_chars: int = Field(default=4000, ge=1)


class ForgettingProtocol(StrictModel):
    """v3: after training, the same evaluation on other tiers of the environment (an env service of their own),
    reported beside the trained tiers' result."""

    tiers: list[int] = Field(min_length=1, description="the flights tiers evaluated (env_service's `tiers`)")
    tasks: int = Field(default=64, ge=1, description="the first N task ids of the evaluated split")


class AblationSettings(StrictModel):
    version: Literal[1, 2, 3] = Field(default=1, description=(
        "the row set: 1 (AgentEvolver's rows, flights.yaml), 2 (on top of a warm start, flights_v2.yaml) or "
        "3 (N, A and GiGPO on multi-call tasks, flights_v3.yaml)"))
    frozen: bool = Field(default=False, description="true once every setting was chosen on validation; "
                                                     "the test split is evaluated only then")
    seeds: list[int] = Field(min_length=1, description="fixed before the first run")
    rows: list[str] | None = Field(default=None, description="the rows run, in order (default: all of the version's)")
    eval: EvalProtocol = Field(default_factory=EvalProtocol)
    curve: CurveProtocol = Field(default_factory=CurveProtocol)
    target_delta: float = Field(default=0.10, gt=0, description="steps to target: the curve reaches base + this")
    run_timeout_min: float = Field(default=45.0, gt=0, description="one (row, seed) training run")
    eval_threads: int = Field(default=2, ge=1, description="torch threads of the evaluations")
    without_warm_start: dict[str, Any] = Field(default_factory=dict, description=(
        "v2: merged into the run YAML of the rows without a warm start (full, env_n), e.g. their own lr and KL"))
    env_pool: EnvPoolProtocol = Field(default_factory=EnvPoolProtocol)
    forgetting: ForgettingProtocol | None = Field(default=None, description=(
        "v3: every run also evaluated on these tiers after training (none: not measured)"))

    @model_validator(mode="after")
    def _rows_of_the_version(self) -> AblationSettings:
        known = ROWS_BY_VERSION[self.version]
        if self.rows is None:
            self.rows = list(known)
        unknown = [r for r in self.rows if r not in known]
        if unknown:
            raise ValueError(f"rows {unknown}: not rows of ablation version {self.version} ({', '.join(known)})")
        if self.version == 1 and self.without_warm_start:
            raise ValueError("without_warm_start: only for ablation version 2")
        if self.version != 3 and self.forgetting is not None:
            raise ValueError("forgetting: only for ablation version 3")
        return self


class Protocol(StrictModel):
    ablation: AblationSettings
    run: dict[str, Any] = Field(description="the `full` row's launcher YAML; every row is derived from it")


def load_protocol(path: Path) -> Protocol:
    protocol = Protocol.model_validate(compose(path))
    if protocol.ablation.version >= 2:
        warm = (protocol.run.get("trainer") or {}).get("warm_start") or {}
        if not warm.get("enabled") or warm.get("source", "synthetic") != "synthetic" or warm.get("from_checkpoint"):
            raise ConfigError("run.trainer.warm_start: the v2/v3 run section is the W+full row: enable the warm start "
                              "on synthetic references (source: synthetic, no from_checkpoint)")
        if "env_n" in (protocol.ablation.rows or []) and protocol.run["trainer"]["rollout"]["env"] != "flights":
            raise ConfigError("ablation.rows: env_n seeds its pool from flights train references (flights only)")
    if protocol.ablation.forgetting is not None and protocol.run["trainer"]["rollout"]["env"] != "flights":
        raise ConfigError("ablation.forgetting: evaluates other flights tiers (flights only)")
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


def derive(run: dict[str, Any], row: str, seed: int, settings: AblationSettings, runs_dir: Path,
           shared_warm_start: Path | None = None) -> dict[str, Any]:
    """One row's launcher YAML, derived from the protocol's `run` section (v1: the `full` row; v2, v3: `w_full`)."""
    if settings.version == 1:
        return derive_v1(run, row, seed, settings, runs_dir)
    return derive_v2(run, row, seed, settings, runs_dir, shared_warm_start)


def _fixed_parts(cfg: dict[str, Any], row: str, seed: int, settings: AblationSettings, runs_dir: Path
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The harness's parts, the same in every row: seed, checkpoint every step, resume, the validation curve."""
    launcher, trainer = cfg.setdefault("launcher", {}), cfg.setdefault("trainer", {})
    launcher.update(experiment=f"{row}-seed{seed}", runs_dir=str(runs_dir), resume=True)
    launcher.setdefault("studio", {})["enabled"] = False
    trainer["seed"] = seed
    trainer["checkpoint"] = {"every": 1, "keep": 2}
    curve = settings.curve
    trainer["eval"] = {"split": "validation", "tasks": curve.tasks, "k": 1, "greedy": True,
                       "every": curve.every if curve.enabled else 0, "before": False, "after": curve.enabled}
    return launcher, trainer


def _keep_services(cfg: dict[str, Any], keep: set[str]) -> None:
    launcher = cfg["launcher"]
    if _needs_llm_server(cfg, keep):
        keep.add("llm_server")
    launcher["services"] = [s for s in launcher.get("services", []) if s in keep]
    launcher["ports"] = {s: p for s, p in (launcher.get("ports") or {}).items() if s in keep}


def _synthetic_tasks_only(cfg: dict[str, Any]) -> None:
    """Zero human data: only the synthesized tasks. An update, not a replacement: `pool_share` stays, so every
    zero-human-data row holds the same tasks apart for the pool."""
    cfg.setdefault("task_manager", {}).setdefault("mixture", {}).update(synthetic_ratio=1.0, use_original=False)
    cfg["trainer"].setdefault("tasks", {})["synthetic_ratio"] = 1.0


def _train_split_only(cfg: dict[str, Any]) -> None:
    """The environment's own train split, no task manager."""
    cfg["launcher"]["synthesis"] = {"episodes": 0}
    cfg["trainer"]["train_split"] = "train"
    cfg["trainer"].pop("tasks", None)


def derive_v1(run: dict[str, Any], row: str, seed: int, settings: AblationSettings, runs_dir: Path) -> dict[str, Any]:
    """The full row with mechanisms switched off (`MECHANISMS_V1`)."""
    if row not in MECHANISMS_V1:
        raise ValueError(f"row {row!r} is not trained (rows: {', '.join(MECHANISMS_V1)})")
    cfg = copy.deepcopy(run)
    launcher, trainer = _fixed_parts(cfg, row, seed, settings, runs_dir)
    rollout, advantage = trainer.setdefault("rollout", {}), trainer.setdefault("advantage", {})
    mechanisms = MECHANISMS_V1[row]
    if row == "grpo":  # the reference row
        keep = {"env_service"}
        _train_split_only(cfg)
    else:
        keep = {"env_service", "task_manager"}
        _synthetic_tasks_only(cfg)
    if "experience" in mechanisms:
        keep.add("experience_manager")
    else:
        rollout["experience_ratio"] = 0.0
        launcher.setdefault("synthesis", {})["seed_experience"] = False  # no pool to seed
    if "judge" in mechanisms:
        keep.add("judge")
    else:
        advantage["estimator"] = "grpo"
    _keep_services(cfg, keep)
    return cfg


def derive_v2(run: dict[str, Any], row: str, seed: int, settings: AblationSettings, runs_dir: Path,
              shared_warm_start: Path | None = None) -> dict[str, Any]:
    """The W+full row with what its version's row table (`ROWS_V2[row]`, `ROWS_V3[row]`) switches off. A row
    sharing the `w` row's warm start loads it from `shared_warm_start` (that row's step-0 checkpoint) instead of
    fine-tuning again."""
    table = ROW_SPECS[settings.version]
    if row not in table:
        raise ValueError(f"row {row!r} is not trained (rows: {', '.join(table)})")
    spec = table[row]
    cfg = copy.deepcopy(run)
    if spec.warm_start is None:
        cfg = deep_merge(cfg, settings.without_warm_start)
    launcher, trainer = _fixed_parts(cfg, row, seed, settings, runs_dir)
    rollout, advantage = trainer.setdefault("rollout", {}), trainer.setdefault("advantage", {})
    if spec.warm_start is None:
        trainer["warm_start"] = {"enabled": False}
    else:
        warm = trainer.setdefault("warm_start", {})
        warm.update(enabled=True, source=spec.warm_start)
        if shares_warm_start(row):
            if shared_warm_start is None:
                raise ValueError(f"row {row} starts from the w row's warm start: give its checkpoint")
            warm["from_checkpoint"] = str(shared_warm_start)
    if not spec.rl:
        trainer["steps"] = 0  # the warm-started policy is evaluated as it is
    keep = {"env_service"}
    if spec.tasks == "synthetic":
        keep.add("task_manager")
        _synthetic_tasks_only(cfg)
    else:
        _train_split_only(cfg)
    synthesis = launcher.setdefault("synthesis", {})
    if spec.demonstrations is None:
        rollout["experience_ratio"] = 0.0
        synthesis["seed_experience"] = False
    else:
        keep.add("experience_manager")
        # `train`: the harness seeds the pool from train references before the launcher starts
        synthesis["seed_experience"] = spec.demonstrations == "synthetic"
    if spec.judge:
        keep.add("judge")
    else:
        advantage["estimator"] = spec.estimator or "grpo"
    _keep_services(cfg, keep)
    return cfg


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`base` with `override`'s keys set, nested mappings merged key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# ---------------------------------------------------------------------------------------------- running


class Harness:
    def __init__(self, protocol_path: Path, protocol: Protocol, results_dir: Path, runs_dir: Path, *,
                 explore: bool, forgetting: bool = True) -> None:
        """`forgetting: false`: the protocol's forgetting evaluation is left out (the pilot's choice)."""
        self.protocol_path, self.protocol = protocol_path, protocol
        self.settings = protocol.ablation
        self.results_dir, self.runs_dir, self.explore = results_dir, runs_dir.resolve(), explore
        self.eval = self.settings.eval.model_copy(update={"split": "validation"}) if explore else self.settings.eval
        self.forgetting = self.settings.forgetting if forgetting else None
        self.protocol_sha = hashlib.sha256(protocol_path.read_bytes()).hexdigest()
        self.git = git_state(REPO)
        self._env_urls: dict[str, str] = {}
        self._stack = ExitStack()

    # -- the shared env services of the evaluations (the runs start their own through the launcher)

    def env_section(self, tiers: list[int] | None = None) -> dict[str, Any]:
        """The run's env service section; with `tiers`, its flights environment serving those tiers instead."""
        section = copy.deepcopy(self.protocol.run.get("env_service") or {})
        if tiers is not None:
            section.setdefault("environments", {}).setdefault("flights", {})["tiers"] = list(tiers)
        return section

    def env_url(self, tiers: list[int] | None = None) -> str:
        key = "run" if tiers is None else "tiers-" + "-".join(map(str, tiers))
        if key not in self._env_urls:
            from tests.helpers import run_service

            conf = self.runs_dir / ("eval-env.yaml" if tiers is None else f"eval-env-{key}.yaml")
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text(yaml.safe_dump({"env_service": self.env_section(tiers)}))
            self._env_urls[key] = self._stack.enter_context(
                run_service("env_service", ["--conf", str(conf)], log_dir=self.runs_dir / "logs")).url
        return self._env_urls[key]

    def close(self) -> None:
        self._stack.close()

    def meta(self, row: str, seed: int) -> dict[str, Any]:
        return {"benchmark": "ablation", "row": row, "seed": seed, "git": self.git,
                "protocol": {"path": str(self.protocol_path), "sha256": self.protocol_sha,
                             "frozen": self.settings.frozen},
                "ablation_version": self.settings.version,
                "explore": self.explore, "eval_protocol": self.eval.model_dump(),
                "curve_protocol": self.settings.curve.model_dump(), "target_delta": self.settings.target_delta}

    def evaluate(self, policy: list[str], *, split: str, tasks: int, k: int, sample: bool, seed: int,
                 tiers: list[int] | None = None) -> dict:
        """`python -m trainer.evaluate` as a child (its model's memory is gone before the next training run):
        the in-process policy alone, no experience, no grammar. `tiers`: against an env service serving those
        flights tiers instead of the run's."""
        rollout = self.protocol.run["trainer"]["rollout"]
        argv = ["--env", rollout["env"], "--split", split, "--tasks", str(tasks), "--k", str(k), "--seed", str(seed),
                "--template", rollout.get("template", "linear"), "--max-turns", str(rollout.get("max_turns", 8)),
                "--max-new-tokens", str(rollout.get("max_new_tokens", 128)),
                "--max-context", str(rollout.get("max_context", 2048)),
                "--concurrency", str(self.eval.concurrency), "--max-batch", str(self.eval.concurrency), "--threads", str(self.settings.eval_threads)]
        if sample:
            argv += ["--sample", "--temperature", str(self.eval.temperature)]
        key = [policy, argv] if tiers is None else [policy, argv, tiers]
        out = self.runs_dir / "evaluations" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO)}
        started = time.monotonic()
        with out.with_suffix(".log").open("wb") as log:
            code = subprocess.run([sys.executable, "-m", "trainer.evaluate", "--env-url", self.env_url(tiers), *argv, *policy,
                                   "--out", str(out)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code != 0:
            raise SystemExit(f"ablation: the evaluation failed (exit {code}); see {out.with_suffix('.log')}")
        result = json.loads(out.read_text())
        return {**result, "argv": argv, "seconds": round(time.monotonic() - started, 1),
                "kinds": self.task_kinds(list(result["per_task"]), tiers)}

    def task_kinds(self, task_ids: list[str], tiers: list[int] | None = None) -> dict[str, str] | None:
        """Each task's kind (flights: its world's task kind), for the per-kind tables; None for another env."""
        if self.protocol.run["trainer"]["rollout"]["env"] != "flights":
            return None
        from env_service.environments.flights.env import FlightsEnvironment

        config = (self.env_section(tiers).get("environments") or {}).get("flights") or {}
        env = FlightsEnvironment(config)
        return {t: env.task(t).kind for t in task_ids}

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
        payload = {**self.meta("base", seed), "eval_start": start}
        if self.forgetting is not None:
            payload["forgetting_start"] = self.forgetting_eval(model, seed)
        if self.settings.curve.enabled and self.curve_starts_at_base():
            payload["curve_start"] = self.evaluate(model, split="validation", tasks=self.settings.curve.tasks, k=1,
                                                   sample=False, seed=seed)
        self.write("base", seed, payload)
        return payload

    def curve_starts_at_base(self) -> bool:
        """Whether a row's curve starts at the base model: a row without a warm start (v3 has none)."""
        table = ROW_SPECS.get(self.settings.version)
        return table is None or any(table[row].warm_start is None for row in self.settings.rows or [] if row in table)

    def forgetting_eval(self, policy: list[str], seed: int) -> dict[str, Any]:
        """The evaluation on the protocol's forgetting tiers: the same split, k and sampling as the main one."""
        assert self.forgetting is not None
        return self.evaluate(policy, split=self.eval.split, tasks=self.forgetting.tasks, k=self.eval.k, sample=True,
                             seed=seed, tiers=self.forgetting.tiers)

    # -- one trained row

    def run_dir(self, row: str, seed: int) -> Path:
        return self.runs_dir / f"{row}-seed{seed}"

    def shared_warm_start(self, row: str, seed: int) -> Path | None:
        """The `w` row's step-0 checkpoint when `row` starts from it (v2), else None."""
        if self.settings.version < 2 or not shares_warm_start(row):
            return None
        return self.run_dir("w", seed) / "trainer" / "checkpoints" / "step_000000.pt"

    def derive(self, row: str, seed: int) -> dict[str, Any]:
        return derive(self.protocol.run, row, seed, self.settings, self.runs_dir, self.shared_warm_start(row, seed))

    def prepare(self, row: str, seed: int) -> None:
        """Before a v2 row's first launch: the `w` row trained once for the seed, its task store copied into the
        rows that train on its synthetic tasks (the launcher then does not synthesize again), and `env_n`'s
        pool seeded from train references."""
        run_dir = self.run_dir(row, seed)
        if self.settings.version < 2 or row == "w":
            return
        if shares_task_store(row) or shares_warm_start(row):
            self.train("w", seed)
            store = run_dir / "task_manager"
            if shares_task_store(row) and not store.exists():
                shutil.copytree(self.run_dir("w", seed) / "task_manager", store)
        if row == "env_n":
            self.seed_train_pool(run_dir)

    def seed_train_pool(self, run_dir: Path) -> dict[str, Any]:
        """The pool of `env_n` (probe 4's recipe): the first `env_pool.per_kind` train tasks of every kind, their
        references replayed, summarized into the store the run's experience manager then opens."""
        done = run_dir / "pool-seeding.json"
        if done.is_file():
            return json.loads(done.read_text())
        from benchmarks.science.loop_probe import seed_pool
        from env_service.environments.flights.env import FlightsEnvironment
        from tests.helpers import run_service
        from trainer.peers import EnvPeer

        run = self.protocol.run
        conf = run_dir / "pool-seeding.yaml"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text(yaml.safe_dump({"experience_manager": {**(run.get("experience_manager") or {}),
                                                               "store": str(run_dir / "experience_store")}}))
        flights = FlightsEnvironment(((run.get("env_service") or {}).get("environments") or {}).get("flights") or {})
        workspace = ((run["trainer"].get("experience") or {}).get("workspace")) or "default"
        pool = self.settings.env_pool

        async def seed(em_url: str) -> dict[str, Any]:
            env = EnvPeer(self.env_url())
            try:
                return await seed_pool(env, flights, em_url, workspace, pool.per_kind, pool.demo_format, pool.obs_chars)
            finally:
                await env.aclose()

        with run_service("experience_manager", ["--conf", str(conf)], log_dir=self.runs_dir / "logs") as em:
            report = asyncio.run(seed(em.url))
        done.write_text(json.dumps(report))
        return report

    def train(self, row: str, seed: int) -> tuple[Path, float]:
        """Train (or continue) one run through the launcher; returns its trainer folder and the wall time."""
        cfg = self.derive(row, seed)
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
        self.prepare(row, seed)
        conf = run_dir.parent / f"{run_dir.name}.yaml"
        conf.write_text(f"# Derived by benchmarks/science/ablation.py from {self.protocol_path} (row {row}, seed {seed}).\n"
                        + yaml.safe_dump(cfg, sort_keys=False))
        log = run_dir.parent / f"{run_dir.name}.launcher.log"
        started = time.monotonic()
        try:
            code = run_launcher(conf, log, self.settings.run_timeout_min * 60)
        finally:
            # Wall time over every launcher invocation of this run, an interrupted one included (the run is
            # continued later from its checkpoint).
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
            payload = {**self.meta(row, seed), "config": self.derive(row, seed),
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
        # Step 0 is the base model's, except after a warm start (which the curve does not measure).
        warm_started = self.settings.version >= 2 and ROW_SPECS[self.settings.version][row].warm_start is not None
        curve = [{"step": 0, "avg@1": base["curve_start"]["avg@1"]}] if "curve_start" in base and not warm_started else []
        curve += [{"step": s, "avg@1": r["eval/avg@1"]} for s, r in records.items() if "eval/avg@1" in r]
        step_seconds = [r["time/step_s"] for r in records.values() if "time/step_s" in r]
        payload = {
            **self.meta(row, seed), "config": self.derive(row, seed),
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
        if self.settings.version >= 2:
            payload["paired_vs_start"].update({
                f"strict_{m}": interval(paired(base["eval_start"], end, m, require_call=True), (-1.0, 1.0))
                for m in ("avg", "best")})
            payload["warm_start"] = summary.get("warm_start")
            shared = self.shared_warm_start(row, seed)
            spent = self.run_dir("w", seed).parent / f"w-seed{seed}.seconds"
            payload["minutes"] = {
                "train": round(wall / 60, 2), "eval": round(end["seconds"] / 60, 2),
                "total": round((wall + end["seconds"]) / 60, 2),
                # the warm start these weights came from, computed once for the seed (in the w row's train)
                "shared_warm_start": round(float(spent.read_text()) / 60, 2) if shared and spent.is_file() else None}
            payload["rollouts"] = run_rollout_stats(out, records)
        if self.forgetting is not None:
            payload["forgetting"] = self.forgetting_row(base, out, seed)
            forgetting_s = payload["forgetting"]["eval_end"]["seconds"]
            payload["minutes"].update(forgetting_eval=round(forgetting_s / 60, 2),
                                      total=round((wall + end["seconds"] + forgetting_s) / 60, 2))
        self.write(row, seed, payload)
        return payload

    def training_stats(self, row: str, seed: int) -> dict[str, Any] | None:
        """A row's training numbers from its run folder once it finished training (not collapsed), before its
        evaluation: its rollouts' counts and its step times; None before."""
        out = self.run_dir(row, seed) / "trainer"
        if not _finished(out, self.derive(row, seed)["trainer"]["steps"]) or collapse_of(out) is not None:
            return None
        records = _step_records(out / "metrics.jsonl")
        return {"rollouts": run_rollout_stats(out, records),
                "step_s": [r["time/step_s"] for r in records.values() if "time/step_s" in r]}

    def forgetting_row(self, base: dict[str, Any], out: Path, seed: int) -> dict[str, Any]:
        """The trained run on the forgetting tiers, paired per task (strict avg) with the base model there."""
        assert self.forgetting is not None
        if "forgetting_start" not in base:
            raise SystemExit(f"ablation: base-seed{seed}.json has no forgetting evaluation (written before "
                             f"ablation.forgetting was set, or by the pilot); delete it to evaluate the base again")
        start = base["forgetting_start"]
        end = self.forgetting_eval(["--checkpoint", str(out / "checkpoints")], seed)
        if end["argv"] != start["argv"]:
            raise SystemExit("ablation: the forgetting evaluation's settings differ from the start's")
        from trainer.summary import interval

        per_task = list(per_task_metric(end, "avg", require_call=True).values())
        return {"tiers": self.forgetting.tiers, "eval_end": end, "strict_avg": sum(per_task) / len(per_task),
                "paired_vs_start": {"strict_avg": interval(paired(start, end, "avg", require_call=True), (-1.0, 1.0))}}


def collapse_of(out: Path) -> dict[str, Any] | None:
    """The trainer's collapse record when its summary.json says the run collapsed, else None."""
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return summary.get("collapse") if summary.get("status") == "collapsed" else None


def _finished(out: Path, steps: int) -> bool:
    from trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(out / "checkpoints")
    return (out / "summary.json").is_file() and latest is not None and latest.name == f"step_{steps:06d}.pt"


def run_rollout_stats(out: Path, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """`ablation_rollouts.rollout_stats` of a trainer folder, each step's groups from its metrics record."""
    groups = {step: int(r["rollout/groups"]) for step, r in records.items() if "rollout/groups" in r}
    return rollout_stats(out / "rollouts", groups)


def _step_records(path: Path) -> dict[int, dict[str, Any]]:
    """Per training step its last metrics record (a step re-run after a resume counts once)."""
    records: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            record = json.loads(line)
            if record["step"] > 0:
                records[int(record["step"])] = record
    return dict(sorted(records.items()))


def run_launcher(conf: Path, log: Path, timeout_s: float) -> int:
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


def write_pilot(harness: Harness, seed: int) -> str:
    """The pilot's go/no-go from the raw JSON written so far: `<results-dir>/pilot.json`, its lines printed."""
    from benchmarks.science.ablation_pilot import pilot_lines, pilot_summary

    written = {row: json.loads(path.read_text()) for row in ("w", "w_q", "w_qa")
               if (path := harness.result_path(row, seed)).is_file()}
    runs = {row: {seed: data} for row, data in written.items() if "failed" not in data}
    trained = {row: stats for row in ("w_q", "w_qa") if row not in written
               and (stats := harness.training_stats(row, seed)) is not None}
    base = harness.result_path("base", seed)
    base_minutes = json.loads(base.read_text())["eval_start"]["seconds"] / 60 if base.is_file() else None
    summary = pilot_summary(runs, seed, harness.settings.eval.tasks, list(harness.settings.rows or []), base_minutes,
                            trained)
    failed = [{"row": row, **data["failed"]} for row, data in written.items() if "failed" in data]
    path = harness.results_dir / "pilot.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**harness.meta("pilot", seed), **summary, "failed": failed}, indent=1))
    for line in pilot_lines(summary):
        print(f"[pilot] {line}", file=sys.stderr, flush=True)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/science/ablation.py", description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", type=Path, help="the frozen protocol YAML (examples/ablation/*.yaml)")
    parser.add_argument("--rows", default=None, help="comma-separated subset of the protocol's rows")
    parser.add_argument("--seeds", default=None, help="comma-separated subset of the protocol's seeds")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="raw JSON per run (default benchmarks/results/ablation/<protocol name>[/explore])")
    parser.add_argument("--runs-dir", type=Path, default=None, help="run folders (default runs/ablation/<name>)")
    parser.add_argument("--explore", action="store_true",
                        help="evaluate on the validation split instead of test (choosing the protocol)")
    parser.add_argument("--pilot", action="store_true", help=(
        "v3's go/no-go: validation, the first seed, rows w and w_q (--rows may add w_qa), no forgetting evaluation; "
        "writes pilot.json beside the runs' raw JSON (default benchmarks/results/ablation/<name>/pilot)"))
    parser.add_argument("--allow-uncommitted", action="store_true",
                        help="evaluate on test although the protocol file is not committed (tests only)")
    parser.add_argument("--report", action="store_true", help="REPORT.md and ablation.png from --results-dir")
    args = parser.parse_args(argv)

    if args.report:
        from benchmarks.science.ablation_report import write_report

        if args.results_dir is None:
            parser.error("--report needs --results-dir")
        line = write_report(args.results_dir)
        for name, verdict in line["criteria"].items():  # v2's pre-registered criteria
            print(f"[ablation] {name}: {verdict}", file=sys.stderr)
        print(json.dumps(line))
        return 0
    if args.protocol is None:
        parser.error("give --protocol (or --report)")
    try:
        protocol = load_protocol(args.protocol)
    except (ConfigError, ValueError) as exc:
        print(f"ablation: {args.protocol}: {exc}", file=sys.stderr)
        return 2
    settings = protocol.ablation
    if args.pilot:
        if settings.version != 3:
            print(f"ablation: --pilot is v3's go/no-go; {args.protocol} is version {settings.version}", file=sys.stderr)
            return 2
        args.explore = True
        args.rows = args.rows or "w,w_q"
        args.seeds = args.seeds or str(settings.seeds[0])
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
    mode = "pilot" if args.pilot else "explore" if args.explore else ""
    results_dir = args.results_dir or REPO / "benchmarks" / "results" / "ablation" / name / mode
    runs_dir = args.runs_dir or REPO / "runs" / "ablation" / (f"{name}-{mode}" if mode else name)
    harness = Harness(args.protocol, protocol, results_dir, runs_dir, explore=args.explore, forgetting=not args.pilot)
    done: list[str] = []
    pilot: str | None = None
    try:
        if args.pilot:  # train every row first: the mixed-outcome groups need no evaluation, so they come first
            for seed in seeds:
                for row in rows:
                    if not harness.result_path(row, seed).is_file():
                        harness.train(row, seed)
                    pilot = write_pilot(harness, seed)
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
                if args.pilot:  # after every row: a pilot stopped early still leaves its go/no-go so far
                    pilot = write_pilot(harness, seed)
    except KeyboardInterrupt:
        print("ablation: interrupted; the same command continues from the last checkpoints", file=sys.stderr)
        return 130
    finally:
        harness.close()
    print(json.dumps({"benchmark": "ablation", "protocol": str(args.protocol), "results": done,
                      "commit": harness.git.get("commit"), **({"pilot": pilot} if pilot else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
