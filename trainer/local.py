"""The local GRPO trainer: rollouts against the env service, advantages, PPO updates, weight sync.

`LocalTrainer.train_step` tells one training step as numbered phases, each one call: 1. tasks (the task
manager's batch, or the next `tasks_per_step` of the data cursor), 2. rollouts (n per task through the policy,
complete groups only), 3. labels (the judge's, when the estimator needs them), 4. advantages (a `StepBatch`,
`trainer.step_batch`, and the estimator's token advantages), 5. update (`PolicyUpdater.update`: old log-probs
on the stripped context, epochs x minibatches), 6. weight sync (to the in-process engine or the served endpoint
via `/v1/weights`, bumping the policy version), 7. feedback (to the experience and task managers), 8. metrics.
Phases 1 to 3 are `_collect_step`: with `overlap` the next step's run while this step updates.
Evaluation (avg@k, best@k, invalid-action rate) runs before training, after the warm start (when there
is one), every `eval.every` steps and at the end; checkpoints every `checkpoint.every` steps; metrics to
JSONL and TensorBoard.
`TrainerActor` runs the same loop inside a Ray actor.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from common.schemas import Task
from engine.device import describe, resolve_device
from engine.models import export_model, load_model, native_bf16
from judge.client import TrajectoryJudgment
from trainer import lora
from trainer.asks import AskPolicy, ask_metrics, ask_policy, environment_steps, refuse_held_out
from trainer.branches import BranchCounters, BranchPoints, BranchRunner, branch_state
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint, set_rng_state
from trainer.collapse import CollapseDetector, RunCollapsed, replies_of_trajectory
from trainer.config import TrainerConfig
from trainer.mechanisms import Mechanisms, step_batch_seed
from trainer.metrics import MetricsLog
from trainer.peers import EnvPeer, ExperiencePeer, JudgePeer, OutagePolicy, TaskPeer, merged_counters
from trainer.policy import EndpointPolicy, InProcessPolicy, Policy, engine_seconds
from trainer.records import RolloutRecords
from trainer.resilience import (
    EmptyStepError,
    StepCounters,
    clients_by_peer,
    counters_dict,
    degradations,
    environment_traceback_hint,
    load_outages,
    outage_table,
)
from trainer.rollout import (
    EVAL_SEED_OFFSET,
    EvalSummary,
    GroupStats,
    Rollout,
    collect_groups,
    environment_failure,
    evaluate_policy,
    evaluation_progress,
    rollout_progress,
)
from trainer.step_batch import StepBatch
from trainer.summary import RunRecord, mechanisms_summary, mixed_outcome_groups, run_summary, write_summary
from trainer.update import PolicyUpdater, UpdateProgress
from trainer.warm_start import warm_start


def rollout_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The in-process engine's weight dtype for `policy.dtype`; None keeps the training model's."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cpu" and native_bf16() else None
    return getattr(torch, name)


class TaskCursor:
    """Walks the training task ids epoch by epoch, each epoch in a seeded shuffled order."""

    def __init__(self, task_ids: list[str], seed: int) -> None:
        if not task_ids:
            raise ValueError("the training split has no tasks")
        self.task_ids, self.seed = list(task_ids), seed
        self.epoch, self.index = 0, 0

    def _order(self) -> list[str]:
        order = list(self.task_ids)
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, k: int) -> list[str]:
        out: list[str] = []
        while len(out) < k:
            order = self._order()
            take = order[self.index:self.index + (k - len(out))]
            out += take
            self.index += len(take)
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


@dataclass
class CollectedStep:
    """One step's rollouts before its update: task ids, complete groups, the judge's judgments (by trajectory
    id; empty when the estimator needs no labels), rollout metrics."""

    task_ids: list[str]
    groups: list[list[Rollout]]
    judgments: dict[str, TrajectoryJudgment]
    metrics: dict[str, float]
    cursor: dict[str, int]  # the task cursor right after this batch was drawn

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g]


def _staleness_metrics(rollouts: list[Rollout], trained_version: int) -> dict[str, float]:
    """How many versions behind the update's starting weights the rollouts were generated (overlap: <= 1)."""
    if not rollouts:
        return {}
    lags = [trained_version - min(r.policy_versions or [r.trajectory.policy_version]) for r in rollouts]
    return {"rollout/version_lag_max": float(max(lags)), "rollout/stale_frac": float(np.mean([x > 0 for x in lags]))}


def _phase_times(started: float, batch_ready: float, updated: float, synced: float, fed_back: float
                 ) -> dict[str, float]:
    """A step's timings. `wait_s`: how long it waited for its batch (all of rollout + judge without overlap);
    `update_s`: from the batch to the updated weights (advantages and records included)."""
    return {"time/wait_s": batch_ready - started, "time/update_s": updated - batch_ready,
            "time/weight_sync_s": synced - updated, "time/feedback_s": fed_back - synced,
            "time/step_s": fed_back - started}


class LocalTrainer:
    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self.out = Path(config.output_dir)
        self.step = 0
        self.policy: Policy | None = None
        self.env: EnvPeer | None = None
        self.mechanisms: Mechanisms | None = None
        self.asks: AskPolicy | None = None  # experience.mode action or step
        self.branches: BranchRunner | None = None  # experience.ask_reward: paired_branch
        self._saved_branches: dict[str, Any] = {}
        self.group_stats = GroupStats()
        self.step_counters = StepCounters()
        self.evaluations: dict[str, EvalSummary] = {}  # "before" / "warm_start" / "after"
        self.collapse = CollapseDetector(config.collapse)
        self.warm_start_report: dict[str, Any] | None = None  # trainer.warm_start, before the first RL step
        self._saved_outages: dict[str, dict[str, Any]] = {}
        # `overlap`: the next step's batch, collected while this step updates, and the cursor before it.
        self._prefetch: asyncio.Task[CollectedStep] | None = None
        self._prefetch_cursor: dict[str, int] = {}

    # ------------------------------------------------------------------ setup

    async def setup(self) -> None:
        cfg = self.config
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)
        self.device = resolve_device(cfg.device, "trainer.device")
        logger.info("trainer.device: {} -> {}", cfg.device, describe(self.device))
        self.model, self.tokenizer = load_model(cfg.model)
        if cfg.lora is not None:
            self.model = lora.wrap(self.model, cfg.lora)
        ref = None
        if cfg.loss.kl_coef > 0:
            ref, _ = load_model(cfg.model)
            for p in ref.parameters():
                p.requires_grad_(False)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.updater = PolicyUpdater(self.model, cfg.optim, cfg.loss, pad_id=pad_id, total_updates=cfg.steps,
                                     device=self.device, ref_model=ref, seed=cfg.seed)
        services = cfg.services
        outage = OutagePolicy(services.outage_budget_s, services.judge_fallback_after_s, services.logs_dir)
        self.env = EnvPeer(services.env_url, timeout=services.timeout_s, outage=outage)
        self.mechanisms = Mechanisms(estimator=cfg.advantage.estimator, experience_ratio=cfg.rollout.experience_ratio,
                                     task_url=services.task_url, experience_url=services.experience_url,
                                     judge_url=services.judge_url, experience=cfg.experience, tasks=cfg.tasks,
                                     timeout=services.timeout_s, outage=outage)
        await self.mechanisms.start()
        self.asks = ask_policy(cfg.experience, self.mechanisms.experience, self.tokenizer)
        train_ids = await self.env.task_ids(cfg.rollout.env, cfg.train_split)
        self.cursor = TaskCursor(train_ids, cfg.seed)
        held_out = await self.env.task_ids(cfg.rollout.env, cfg.eval.split)
        self.eval_tasks = [Task(task_id=t, env_type=cfg.rollout.env, split=cfg.eval.split)
                           for t in held_out[:cfg.eval.tasks]]
        self.out.mkdir(parents=True, exist_ok=True)
        run_id_file = self.out / "run_id"
        if not (cfg.resume and run_id_file.is_file()):
            run_id_file.write_text(uuid.uuid4().hex[:12])
        self.run_id = run_id_file.read_text().strip()
        if cfg.resume:
            self._restore()
        if cfg.policy.kind == "endpoint":
            assert cfg.policy.url is not None
            self.policy = EndpointPolicy(cfg.policy.url, cfg.policy.served_model, api_key_env=cfg.policy.api_key_env,
                                         weights_dir=self.out / "weights", outage=outage.client_options("llm_server"),
                                         transfer=cfg.policy.weights_transfer)
            if self.step > 0:  # the server may hold older weights than the checkpoint
                await self.policy.load_weights(lora.serving_view(self.model))
        else:
            self.policy = self._in_process_policy(cfg.policy.max_batch, policy_version=self.step)
            logger.info("rollout engine: {} weights, log-probs {}", next(self.policy.engine.model.parameters()).dtype,
                        "reusable as old ones" if self.policy.exact_logprobs else "recomputed by the update")
        load_outages(self.peer_clients(), self._saved_outages)
        self.branches = await self._branch_runner()
        self.metrics = MetricsLog(self.out, tensorboard=cfg.tensorboard)
        self.records = RolloutRecords(self.out / "rollouts", self.tokenizer)  # for the studio
        (self.out / "config.json").write_text(cfg.model_dump_json(indent=2))

    async def _branch_runner(self) -> BranchRunner | None:
        """`ask_reward: paired_branch`: the branch runner, once the environment has said how a branch reaches an
        ask's state (it forks, or it is deterministic); an environment that can do neither stops the run here."""
        cfg = self.config
        if cfg.experience.ask_reward != "paired_branch":
            return None
        assert self.env is not None and self.asks is not None and self.policy is not None
        state = branch_state(await self.env.capabilities(cfg.rollout.env), cfg.experience.branch_state,
                             cfg.rollout.env)
        logger.info("paired branches for asks on {}: {} of the asking rollouts, by {}", cfg.rollout.env,
                    cfg.experience.branch_share, state)
        runner = BranchRunner(self.env, self.policy.generate, self.tokenizer, cfg.rollout, self.asks, state=state,
                              share=cfg.experience.branch_share, seed=cfg.seed, grader=self.mechanisms.tasks
                              if self.mechanisms is not None else None)
        runner.counters = BranchCounters(**self._saved_branches)
        return runner

    def _restore(self) -> None:
        path = latest_checkpoint(self.out / "checkpoints")
        if path is None:
            logger.info("resume: no checkpoint in {}, starting fresh", self.out / "checkpoints")
            return
        state = load_checkpoint(path)
        # A LoRA run resumes from its adapter state; "model" holds the merged weights (for evaluation).
        self.model.load_state_dict(state["lora"] if lora.is_peft(self.model) else state["model"])
        self.updater.load_state_dict(state["updater"])
        self.cursor.load(state["cursor"])
        self.group_stats = GroupStats(**state.get("group_stats", {}))
        self._saved_branches = state.get("branches", {})  # onto the branch runner once it exists
        # The held-out "before" (and "warm_start") results: without them a resumed run's summary has no changes.
        self.evaluations = {label: EvalSummary(**saved) for label, saved in state.get("evaluations", {}).items()}
        self.warm_start_report = state.get("warm_start")
        assert self.mechanisms is not None
        self.mechanisms.load_counters(state.get("mechanisms", {}))
        resilience = state.get("resilience", {})
        self.step_counters = StepCounters(**resilience.get("steps", {}))
        self.collapse.load_state_dict(state.get("collapse", {}))
        self.step_counters.resumes += 1
        self._saved_outages = resilience.get("outages", {})  # onto the clients once the policy exists
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        logger.info("resumed from {} at step {} (cursor epoch {} index {})", path.name, self.step,
                    self.cursor.epoch, self.cursor.index)

    def save(self) -> Path:
        payload = {"model": lora.merged_state_dict(self.model), "updater": self.updater.state_dict(),
                   "cursor": self._prefetch_cursor if self._prefetch is not None else self.cursor.state(),
                   "group_stats": vars(self.group_stats),
                   "branches": vars(self.branches.counters) if self.branches is not None else {},
                   "evaluations": {label: asdict(summary) for label, summary in self.evaluations.items()},
                   "mechanisms": self.mechanisms.counters() if self.mechanisms is not None else {},
                   "resilience": {"steps": self._step_counters(),
                                  "outages": {name: vars(c) for name, c in self._outage_counters().items()}},
                   "collapse": self.collapse.state_dict(), "warm_start": self.warm_start_report,
                   "config": self.config.model_dump()}
        if lora.is_peft(self.model):
            payload["lora"] = self.model.state_dict()
        path = save_checkpoint(self.out / "checkpoints", self.step, payload, keep=self.config.checkpoint.keep)
        logger.info("checkpoint {}", path)
        return path

    # ------------------------------------------------------------------ steps

    async def evaluate(self, label: str | None = None) -> dict[str, float]:
        """Held-out avg@k, best@k and invalid-action rate; `label` keeps the result for the summary."""
        cfg = self.config
        assert self.policy is not None and self.env is not None
        started = time.monotonic()
        wide = self._evaluation_engine()
        engine_before = engine_seconds(wide or self.policy)
        try:
            episodes = len(self.eval_tasks) * cfg.eval.k
            progress = evaluation_progress(episodes, started)
            # A wider engine fills only with as many episodes in flight as it has rows (rollout.concurrency
            # alone kept a 128-row engine at 32 rows).
            rollout = (cfg.rollout if wide is None else
                       cfg.rollout.model_copy(update={"concurrency": max(cfg.rollout.concurrency,
                                                                         wide.engine.max_batch)}))
            summary = await evaluate_policy(self.eval_tasks, self.env, (wide or self.policy).generate, self.tokenizer,
                                            rollout, k=cfg.eval.k, greedy=cfg.eval.greedy,
                                            seed=cfg.seed + EVAL_SEED_OFFSET, on_rollout=progress)
            # With asks on, the same tasks and seeds again: "with asks" beside the plain numbers.
            with_asks = (await evaluate_policy(self.eval_tasks, self.env, (wide or self.policy).generate,
                                               self.tokenizer, rollout, k=cfg.eval.k, greedy=cfg.eval.greedy,
                                               seed=cfg.seed + EVAL_SEED_OFFSET, on_rollout=progress,
                                               asks=await self._evaluation_asks())
                         if cfg.eval.asks else None)
        finally:
            if wide is not None:
                await wide.aclose()
        if label:
            self.evaluations[label] = summary
            if with_asks is not None:
                self.evaluations[f"{label}_asks"] = with_asks
        metrics = summary.metrics("eval")
        if with_asks is not None:
            metrics.update(with_asks.metrics("eval_asks"))
        metrics["time/eval_s"] = time.monotonic() - started
        engine_after = engine_seconds(wide or self.policy)
        if engine_before is not None and engine_after is not None:
            metrics["time/eval_prefill_s"] = engine_after[0] - engine_before[0]
            metrics["time/eval_decode_s"] = engine_after[1] - engine_before[1]
        return metrics

    async def _evaluation_asks(self) -> AskPolicy:
        """The run's asks for a held-out evaluation, after checking that no held-out task reached the pool."""
        assert self.asks is not None and self.experience is not None and self.env is not None
        held_out = await self.env.task_ids(self.config.rollout.env, self.config.eval.split)
        refuse_held_out(await self.experience.source_task_ids(), held_out, self.experience.workspace)
        return self.asks

    def _evaluation_engine(self) -> InProcessPolicy | None:
        """A wider engine for held-out evaluation (`eval.max_batch`), on a copy of the current weights.

        Its own copy: the lean forward fuses the weights it serves in place, so a second engine over the rollout
        engine's model would leave that engine reading stale tensors after the next update."""
        cfg = self.config
        assert self.policy is not None
        if not (isinstance(self.policy, InProcessPolicy) and cfg.eval.max_batch
                and cfg.eval.max_batch > self.policy.engine.max_batch):
            return None
        return self._in_process_policy(cfg.eval.max_batch, policy_version=self.policy.policy_version)

    def _in_process_policy(self, max_batch: int, policy_version: int) -> InProcessPolicy:
        """An engine over a plain copy of the current weights, in the rollout numerics (`policy.dtype`)."""
        cfg = self.config
        return InProcessPolicy(lora.merged_copy(self.model), self.tokenizer, max_batch=max_batch,
                               threads=cfg.policy.threads, policy_version=policy_version,
                               prefix_cache_mb=cfg.policy.prefix_cache_mb,
                               dtype=rollout_dtype(cfg.policy.dtype, self.device))

    async def _collect_step(self, step: int) -> CollectedStep:
        """Phases 1 to 3 of step `step` (0-based): its tasks, their rollout groups and the judge's labels, with
        their metrics. `train_step` runs them, or, with `overlap`, starts them while the previous step updates."""
        cfg = self.config
        assert self.mechanisms is not None
        step_seed = step_batch_seed(cfg.seed, step)
        started = time.monotonic()
        # 1. Tasks.
        tasks = await self._next_tasks(step_seed)
        cursor = self.cursor.state()
        # 2. Rollouts: complete groups only; a step without any is collected again, then fails.
        dropped_before = self.group_stats.dropped_groups
        points = self.branches.points() if self.branches is not None else None
        groups = await self._collect(tasks, step, step_seed, started, points)
        rolled_out = time.monotonic()
        metrics = self._collection_metrics(tasks, groups, self.group_stats.dropped_groups - dropped_before,
                                           rolled_out - started)
        # 3. Labels: the judge's step labels (when the estimator needs them), the paired branches' ask credits.
        judgments = await self.mechanisms.label([r.trajectory for g in groups for r in g])
        metrics["time/judge_s"] = time.monotonic() - rolled_out
        if self.branches is not None and points is not None:  # before the estimator reads the asks' credits
            metrics.update(await self.branches.run(groups, {t.task_id: t for t in tasks}, points))
        return CollectedStep([t.task_id for t in tasks], groups, judgments or {}, metrics, cursor)

    async def train_step(self) -> dict[str, float]:
        """One training step, told as its numbered phases (docs/services/trainer.md, "One step").

        With `overlap`, the next step's batch is collected while this one updates: its rollouts are
        generated by this step's starting policy (or, once the new weights are loaded, by the next),
        so they are at most one version stale when trained on; its tasks are drawn before this step's
        curriculum and experience feedback is sent, which therefore lags one step.
        """
        assert self.policy is not None
        step = self.step
        started = time.monotonic()
        # 1. Tasks, 2. rollouts, 3. labels: `_collect_step`, run now, or already run while the last step updated.
        collected = await self._take_batch(step)
        batch_ready = time.monotonic()
        # The version the update starts from: a rollout generated by an older one is off-policy.
        trained_version = self.policy.policy_version
        metrics = {**collected.metrics, **self._observe_rollouts(collected.rollouts, step, trained_version)}
        # While the update runs, the next step's batch (its phases 1 to 3) is prefetched (`overlap`).
        self._prefetch_next(step)
        if collected.rollouts:
            # 4. Advantages: the step batch, from rollout to loss, its token advantages, recorded for the studio.
            batch = self._step_batch(collected)
            metrics.update(self._advantages(batch, step))
            self.records.write(step + 1, batch, trained_version=trained_version)
            # 5. Update: old log-probs, then epochs x minibatches optimizer steps.
            metrics.update(await self._update(batch, trained_version))
        updated = time.monotonic()
        # 6. Weight sync: the new weights to the rollout engine or the serving endpoint.
        version = await self._sync_weights()
        synced = time.monotonic()
        # 7. Feedback: trajectories to the experience manager, pass rates to the task manager.
        await self._feedback(collected.groups, step)
        fed_back = time.monotonic()
        # 8. Metrics: the step's timings and the mechanisms' counters; its batch to batches.jsonl.
        metrics.update(self._step_metrics(_phase_times(started, batch_ready, updated, synced, fed_back), version))
        self._log_batch(step, collected)
        self.step += 1
        return metrics

    async def _next_tasks(self, step_seed: int) -> list[Task]:
        """Phase 1: the step's tasks, from the task manager (its mixture and curriculum; the batch is a function
        of the step's seed and its curriculum state), else the next ones of the environment's training split."""
        cfg = self.config
        assert self.mechanisms is not None
        sampled = await self.mechanisms.next_tasks(cfg.tasks_per_step, cfg.rollout.env, seed=step_seed)
        if sampled is not None:
            return sampled
        return [Task(task_id=t, env_type=cfg.rollout.env, split=cfg.train_split)
                for t in self.cursor.next_batch(cfg.tasks_per_step)]

    async def _take_batch(self, step: int) -> CollectedStep:
        """Phases 1 to 3: the batch prefetched while the previous step updated, else collected now."""
        if self._prefetch is not None:
            collected = await self._prefetch
            self._prefetch = None
            return collected
        return await self._collect_step(step)

    def _observe_rollouts(self, rollouts: list[Rollout], step: int, trained_version: int) -> dict[str, float]:
        """How stale the batch's rollouts are, and the collapse detector's reading of their replies."""
        return {**_staleness_metrics(rollouts, trained_version),
                **self.collapse.observe(step + 1, [replies_of_trajectory(r.trajectory, r.invalid_steps)
                                                   for r in rollouts])}

    def _prefetch_next(self, step: int) -> None:
        """`overlap`: start collecting the next step's batch; it runs from the update's first await on."""
        if self.config.overlap and step + 1 < self.config.steps:
            self._prefetch_cursor = self.cursor.state()  # what a checkpoint taken meanwhile resumes from
            self._prefetch = asyncio.create_task(self._collect_step(step + 1))

    def _step_batch(self, collected: CollectedStep) -> StepBatch:
        """Phase 4's batch. Only a generator with the training numerics gives log-probs that may stand for the old
        ones."""
        return StepBatch(collected.groups, collected.judgments,
                         exact_logprobs=getattr(self.policy, "exact_logprobs", False))

    def _advantages(self, batch: StepBatch, step: int) -> dict[str, float]:
        """Phase 4: the estimator's token advantages onto the batch; returns its metrics."""
        advantage = self.config.advantage
        return batch.estimate(advantage.estimator, advantage.estimator_config(), step)

    async def _update(self, batch: StepBatch, trained_version: int) -> dict[str, float]:
        """Phase 5: `PolicyUpdater.update` in a worker thread, so the event loop (a prefetch) runs meanwhile."""
        return await asyncio.to_thread(self.updater.update, batch.samples(), policy_version=trained_version,
                                       progress=_update_progress)

    async def _sync_weights(self) -> int:
        """Phase 6: the updated weights to the policy; returns the policy version they became."""
        assert self.policy is not None
        return await self.policy.load_weights(lora.serving_view(self.model))

    async def _feedback(self, groups: list[list[Rollout]], step: int) -> None:
        """Phase 7: the step's trajectories to the experience manager, pass rates to the task manager."""
        assert self.mechanisms is not None
        # Request ids tie the calls to (run, step): a resumed run re-sending a step is not applied twice.
        await self.mechanisms.after_step([[r.trajectory for r in g] for g in groups], self.config.rollout.env,
                                         request_id=f"{self.run_id}-step{step}")

    def _step_metrics(self, times: dict[str, float], version: int) -> dict[str, float]:
        """Phase 8: the step's timings, the policy version, the mechanisms' counters."""
        return {**times, "policy/version": float(version), **self._mechanism_metrics()}

    def _log_batch(self, step: int, collected: CollectedStep) -> None:
        """Phase 8: which tasks the step trained on, and the task cursor after them (`batches.jsonl`)."""
        with (self.out / "batches.jsonl").open("a") as f:
            f.write(json.dumps({"step": step + 1, "task_ids": collected.task_ids,
                                "cursor": collected.cursor}) + "\n")

    async def _collect(self, tasks: list[Task], step: int, step_seed: int, started: float,
                       points: BranchPoints | None = None) -> list[list[Rollout]]:
        """The step's complete groups; a step with none is collected again, then fails naming the cause.
        `points`: the step's branch points (paired branches), recorded by the asks' `on_ask` hook."""
        cfg = self.config
        assert self.policy is not None and self.env is not None and self.mechanisms is not None
        experience = self.mechanisms.experience if cfg.rollout.experience_ratio > 0 else None
        for attempt in range(cfg.empty_step_retries + 1):
            groups = await collect_groups(tasks, self.env, self.policy.generate, self.tokenizer, cfg.rollout,
                                          experience=experience, grader=self.mechanisms.tasks, seed=step_seed,
                                          stats=self.group_stats, inject=self.mechanisms.experience_config.inject,
                                          demonstration_observation_tokens=(
                                              self.mechanisms.experience_config.demonstration_observation_tokens),
                                          on_rollout=rollout_progress(len(tasks) * cfg.rollout.n, started),
                                          asks=self.asks if points is None or self.asks is None
                                          else replace(self.asks, on_ask=points.on_ask))
            failure = environment_failure(groups)
            if groups and failure is None:
                return groups
            why = (f"every rollout ended in an environment error ({failure})" if failure
                   else f"all {len(tasks)} groups dropped (last error: {self.group_stats.last_error})")
            if attempt < cfg.empty_step_retries:
                self.step_counters.empty_step_retries += 1
                logger.warning("step {}: {}; collecting it again ({}/{})", step + 1, why, attempt + 1,
                               cfg.empty_step_retries)
        if failure:
            raise EmptyStepError(f"step {step + 1}: every rollout ended in an environment error in "
                                 f"{cfg.empty_step_retries + 1} attempts; the environment said: {failure}"
                                 + environment_traceback_hint(self.config.services.logs_dir))
        raise EmptyStepError(f"step {step + 1}: all {len(tasks)} task groups were dropped in "
                             f"{cfg.empty_step_retries + 1} attempts; last rollout error: "
                             f"{self.group_stats.last_error or 'none recorded'}")

    def peer_clients(self) -> dict[str, list[Any]]:
        return clients_by_peer(self.env, self.mechanisms, self.policy)

    def _outage_counters(self) -> dict[str, Any]:
        return {name: merged_counters(*group) for name, group in self.peer_clients().items()}

    def _step_counters(self) -> dict[str, int]:
        """This run's step counters, the model server's weight reloads of this trainer process included."""
        counters = counters_dict(self.step_counters)
        counters["policy_reloads"] += getattr(self.policy, "restored", 0)
        return counters

    def resilience_summary(self) -> dict[str, Any]:
        """Outages each peer had and what they cost, retried rollouts and steps, every degradation."""
        stats = self.group_stats
        return {"outages": outage_table(self.peer_clients()),
                "rollouts_retried": stats.retried_rollouts, "failed_attempts": stats.failed_attempts,
                "rollouts_lost_with_env_worker": stats.lost_to_env_workers,
                "rollouts_collected_again": stats.collected_again,
                "dropped_groups": stats.dropped_groups, **self._step_counters(),
                "degradations": degradations(self.mechanisms)}

    async def summary(self, plot: Path | None) -> dict[str, Any]:
        """The end-of-run summary: the mechanisms' counters and services first, then this run's record."""
        mechanisms = await mechanisms_summary(self.tasks, self.experience, self.judge,
                                              self.config.experience.inject, self.group_stats,
                                              self.config.experience.mode)
        if self.branches is not None and "self_navigating" in mechanisms:
            # ask_reward: paired_branch -- branches run, their cost, the mean difference and the share positive
            mechanisms["self_navigating"].update(self.branches.counters.summary())
        record = RunRecord(
            collapsed=self.collapse.collapsed, steps=self.step, output_dir=self.out, run_id=self.run_id,
            stats=self.group_stats, plot=plot, before=self.evaluations.get("before"),
            after=self.evaluations.get("after"), eval_split=self.config.eval.split, metrics=self.metrics.records(),
            warm_start=self.warm_start_report, resilience=self.resilience_summary(),
            collapse=self.collapse.summary(), after_warm_start=self.evaluations.get("warm_start"))
        summary = run_summary(record, mechanisms)
        # eval.asks: each held-out evaluation again with asks on, beside the plain ones (`eval`).
        with_asks = {label.removesuffix("_asks"): s.metrics("eval_asks")
                     for label, s in self.evaluations.items() if label.endswith("_asks")}
        if with_asks:
            summary["eval_with_asks"] = with_asks
        return summary

    @property
    def tasks(self) -> TaskPeer | None:
        return self.mechanisms.tasks if self.mechanisms is not None else None

    @property
    def experience(self) -> ExperiencePeer | None:
        return self.mechanisms.experience if self.mechanisms is not None else None

    @property
    def judge(self) -> JudgePeer | None:
        return self.mechanisms.judge if self.mechanisms is not None else None

    def _mechanism_metrics(self) -> dict[str, float]:
        return self.mechanisms.metrics() if self.mechanisms is not None else {}

    def _collection_metrics(self, tasks: list[Task], groups: list[list[Rollout]], dropped: int,
                            seconds: float) -> dict[str, float]:
        """Phase 2's metrics: the groups kept and dropped, the share of synthetic tasks, the rollouts'."""
        return {"time/rollout_s": seconds, "rollout/dropped_groups": float(dropped),
                "rollout/groups": float(len(groups)), "rollout/mixed_outcome_groups": float(mixed_outcome_groups(groups)),
                "rollout/synthetic_frac": float(np.mean([t.synthetic for t in tasks])),
                **self._rollout_metrics([r for g in groups for r in g], seconds)}

    def _rollout_metrics(self, rollouts: list[Rollout], seconds: float) -> dict[str, float]:
        if not rollouts:
            return {}
        rewards = [float(r.trajectory.outcome or 0.0) for r in rollouts]
        steps = sum(len(environment_steps(r.trajectory.steps)) for r in rollouts)  # asks are counted apart
        tokens = sum(r.generated_tokens for r in rollouts)
        return {**self._ask_metrics(rollouts),
            "rollout/reward_mean": float(np.mean(rewards)), "rollout/reward_std": float(np.std(rewards)),
            "rollout/success_rate": float(np.mean([x >= 1.0 for x in rewards])),
            "rollout/truncated_frac": float(np.mean([r.trajectory.truncated for r in rollouts])),
            "rollout/invalid_action_rate": sum(r.invalid_steps for r in rollouts) / max(steps, 1),
            # steps the environment itself failed (raised, 5xx): not the policy's fault, counted apart
            "rollout/env_error_rate": sum(r.environment_error_steps for r in rollouts) / max(steps, 1),
            "rollout/turns_mean": steps / len(rollouts),
            "rollout/generated_tokens": float(tokens), "rollout/tokens_per_s": tokens / max(seconds, 1e-9),
            "rollout/experience_frac": float(np.mean([r.trajectory.experience_flag for r in rollouts])),
        }

    def _ask_metrics(self, rollouts: list[Rollout]) -> dict[str, float]:
        """experience.mode action: how often the policy asks, and success with and without an ask; step: searches."""
        if self.asks is None:
            return {}
        if self.asks.mode == "step":
            return {"rollout/step_retrievals_mean": float(np.mean([r.retrievals for r in rollouts]))}
        return {f"rollout/{k}": v for k, v in ask_metrics([r.trajectory for r in rollouts]).items()}

    # ------------------------------------------------------------------ the run

    async def run(self) -> dict[str, Any]:
        cfg = self.config
        await self.setup()
        try:
            history: list[dict[str, float]] = []
            if self.collapse.collapsed and cfg.collapse.enabled:  # resumed: a collapsed run is not continued
                raise RunCollapsed(self.collapse.collapse["message"])
            if cfg.eval.before:
                await self._evaluate_at_start("before", "before training", history)
            if cfg.warm_start.enabled and self.step == 0 and self.warm_start_report is None:
                assert self.policy is not None and self.env is not None
                self.warm_start_report = await warm_start(
                    cfg.warm_start, cfg.rollout, cfg.seed, env=self.env,
                    tasks=self.tasks.client if self.tasks is not None else None, tokenizer=self.tokenizer,
                    model=self.model, device=self.device, policy=self.policy, ref_model=self.updater.ref_model)
                if cfg.checkpoint.every:  # a resumed run starts from the warm-started weights
                    self.save()
            if cfg.evaluates_after_warm_start:  # the summary splits the change: warm start, then RL
                await self._evaluate_at_start("warm_start", "after the warm start", history)
            progress = _progress(cfg.progress, cfg.steps, self.step)
            while self.step < cfg.steps:
                metrics = await self.train_step()
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                    metrics.update(await self.evaluate())
                if self.step == cfg.steps and cfg.eval.after:
                    metrics.update(await self.evaluate("after"))
                self.metrics.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                    self.save()
                progress(self.step, metrics)
                if self.collapse.collapsed:
                    write_summary(self.out, await self.summary(self.metrics.plot() if cfg.plot else None))
                    raise RunCollapsed(self.collapse.collapse["message"])
            if self.experience is not None:  # what waited for the experience manager, with the full budget
                await self.experience.deliver_pending(wait=True)
            if cfg.export_dir:
                export_model(lora.merged_copy(self.model), self.tokenizer, cfg.export_dir)
            plot = self.metrics.plot() if cfg.plot else None
            summary = await self.summary(plot)
            write_summary(self.out, summary)
            return {**summary, "history": history}
        finally:
            await self.close()

    async def _evaluate_at_start(self, label: str, when: str, history: list[dict[str, float]]) -> None:
        """A held-out evaluation before the first RL step, kept as `label`; once per run, resumes included."""
        if self.step != 0 or label in self.evaluations:
            return
        metrics = await self.evaluate(label)
        self.metrics.log(0, metrics)
        history.append({"step": 0, **metrics})
        logger.info("eval {}: {}", when, _short(metrics))
        if self.config.checkpoint.every:  # a run killed later resumes without evaluating again
            self.save()

    async def close(self) -> None:
        if self._prefetch is not None:  # a run ended early (an error, a caller stopping between steps)
            self._prefetch.cancel()
            await asyncio.gather(self._prefetch, return_exceptions=True)
            self._prefetch = None
        if self.policy is not None:
            await self.policy.aclose()
        if self.env is not None:
            await self.env.aclose()
        if self.mechanisms is not None:
            await self.mechanisms.aclose()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()


def _short(metrics: dict[str, float]) -> str:
    keys = [k for k in metrics if k.startswith(("eval/", "rollout/reward_mean", "update/pg_loss"))]
    return ", ".join(f"{k}={metrics[k]:.3f}" for k in keys)


def _update_progress(event: UpdateProgress) -> None:
    logger.info("update minibatch {}/{}: {} tokens, loss {:.4f}", event.minibatch, event.total, event.tokens,
                event.loss)


def _progress(enabled: bool, total: int, start: int):
    """A tqdm bar over steps (the trainer may run inside a Ray actor, whose stdout Ray forwards)."""
    if not enabled:
        return lambda step, metrics: logger.info("step {}/{}: {}", step, total, _short(metrics))
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)

    def update(step: int, metrics: dict[str, float]) -> None:
        bar.update(1)
        bar.set_postfix(reward=f"{metrics.get('rollout/reward_mean', float('nan')):.3f}")
        if step >= total:
            bar.close()

    return update

