"""Training an agent the user already has (`trainer.agent`): each step runs it through the gateway, then trains
the policy on what the gateway recorded, with the same step batch, estimators and update as in-loop runs.

One step: the next `tasks_per_step` tasks of the JSONL file -> `rollout.n` episodes each (`trainer.agents`),
complete groups only -> judge labels of each call when the estimator needs them -> `StepBatch` -> advantages ->
`PolicyUpdater.update` -> the new weights to the gateway's server (`POST /v1/weights`, which waits for open
episodes: an episode samples from one policy version) -> experience summaries and usage feedback.
`trainer.eval`: the agent on held-out tasks before training, after the warm start and after the last step
(`trainer.agent_evaluation`), written into the summary as an in-loop run's evaluations are.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from engine.device import resolve_device
from engine.models import load_model
from llm_server.client import LLMServerClient
from trainer import lora
from trainer.agent_evaluation import HeldOut, eval_sampling, evaluate_agent, held_out_tasks
from trainer.agent_questioning import AgentQuestioning, KeptTask, warm_start_segments
from trainer.agents import AgentRunner, import_callable, make_agent, read_tasks
from trainer.config import TrainerConfig
from trainer.local import TaskCursor
from trainer.mechanisms import Mechanisms
from trainer.metrics import MetricsLog
from trainer.peers import EnvPeer, OutagePolicy
from trainer.policy import EndpointPolicy
from trainer.records import RolloutRecords
from trainer.resilience import EmptyStepError
from trainer.rollout import EVAL_SEED_OFFSET, EvalSummary, GroupStats
from trainer.step_batch import StepBatch
from trainer.summary import (
    eval_table,
    loop_checks,
    mechanisms_summary,
    mixed_outcome_groups,
    training_signal,
    write_summary,
)
from trainer.update import PolicyUpdater
from trainer.warm_start import fine_tune


class AgentTrainer:
    def __init__(self, config: TrainerConfig) -> None:
        if config.agent is None or config.policy.url is None:
            raise ValueError("AgentTrainer needs trainer.agent and policy.url")
        self.config, self.agent_config = config, config.agent
        self.out = Path(config.output_dir)
        self.step = 0

    async def setup(self) -> None:
        cfg, agent = self.config, self.agent_config
        assert agent is not None and cfg.policy.url is not None
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        torch.manual_seed(cfg.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tasks = read_tasks(agent.tasks, agent.task_id_field)
        self.by_id = {str(t[agent.task_id_field]): t for t in self.tasks}
        self.cursor = TaskCursor(list(self.by_id), cfg.seed)
        self.model, self.tokenizer = load_model(cfg.model)
        if cfg.lora is not None:
            self.model = lora.wrap(self.model, cfg.lora)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.updater = PolicyUpdater(self.model, cfg.optim, cfg.loss, pad_id=pad_id, total_updates=cfg.steps,
                                     device=resolve_device(cfg.device, "trainer.device"), seed=cfg.seed)
        services = cfg.services
        outage = OutagePolicy(services.outage_budget_s, services.judge_fallback_after_s, services.logs_dir)
        self.policy = EndpointPolicy(cfg.policy.url, cfg.policy.served_model, api_key_env=cfg.policy.api_key_env,
                                     weights_dir=self.out / "weights", outage=outage.client_options("llm_server"))
        self.gateway = LLMServerClient(cfg.policy.url, timeout=services.timeout_s)
        # Versions go on from the server's: every call's recorded version then compares with the trained one.
        self.policy.policy_version = await self.gateway.policy_version()
        self.mechanisms = Mechanisms(estimator=cfg.advantage.estimator, experience_ratio=cfg.rollout.experience_ratio,
                                     experience_url=services.experience_url, judge_url=services.judge_url,
                                     task_url=services.task_url if agent.questioning is not None else None,
                                     experience=cfg.experience, tasks=cfg.tasks, timeout=services.timeout_s,
                                     outage=outage)
        await self.mechanisms.start()
        self.env = (EnvPeer(services.env_url, timeout=services.timeout_s, outage=outage)
                    if agent.env is not None and services.env_url else None)
        grader = import_callable(agent.grader, "agent.grader") if agent.grader else None
        agent_fn = make_agent(agent)
        self.runner = AgentRunner(agent, self.gateway, agent_fn, grader=grader, env=self.env,
                                  env_url=services.env_url, experience=self.mechanisms.experience,
                                  experience_ratio=cfg.rollout.experience_ratio, task_grader=self.mechanisms.tasks)
        self.questioning: AgentQuestioning | None = None
        if agent.questioning is not None and self.mechanisms.tasks is not None and agent.env is not None:
            # Its own runner: exploration and reference runs are off-policy and counted apart from RL episodes.
            explorer = AgentRunner(agent, self.gateway, agent_fn, env=self.env, env_url=services.env_url,
                                   task_grader=self.mechanisms.tasks)
            self.questioning = AgentQuestioning(agent.questioning, explorer, self.mechanisms.tasks.client, agent.env)
        # Its own runner: no experience, its episodes never rollouts, its failures counted apart from training's.
        self.evaluator = AgentRunner(agent, self.gateway, agent_fn, grader=grader, env=self.env,
                                     env_url=services.env_url)
        self.held_out: HeldOut | None = await held_out_tasks(agent, cfg.eval, self.env, set(self.by_id))
        self.evaluations: dict[str, EvalSummary] = {}
        self.device = resolve_device(cfg.device, "trainer.device")
        self.warm_start_report: dict[str, Any] | None = None
        self.metrics = MetricsLog(self.out, tensorboard=cfg.tensorboard)
        self.records = RolloutRecords(self.out / "rollouts", self.tokenizer)
        self.run_id = uuid.uuid4().hex[:12]
        (self.out / "run_id").write_text(self.run_id)
        (self.out / "config.json").write_text(cfg.model_dump_json(indent=2))

    async def question(self) -> None:
        """Before RL: questioning from the agent's own tool calls, the kept tasks added to the RL tasks, and the
        warm start on the agent's runs of their references."""
        assert self.questioning is not None and self.agent_config.questioning is not None
        report = await self.questioning.run(self.tasks)
        logger.info("questioning: {} explored episodes, {} observed calls, {} tasks kept", report.explored_episodes,
                    report.observed_calls, len(report.kept))
        settings = self.agent_config.questioning
        if not settings.train_on_tasks:
            if not report.kept:
                raise EmptyStepError(f"agent.questioning.train_on_tasks is false (RL on the kept tasks only), and the "
                                     f"agent's runs reached none of the tasks synthesized from "
                                     f"{report.explored_episodes} explored episodes; nothing is left to train on")
            self.by_id = {}
        if settings.train_on_kept and report.kept:
            for kept in report.kept:
                self.runner.synthetic[kept.env_task.task_id] = kept.env_task
                self.by_id[kept.env_task.task_id] = kept.task
        self.cursor = TaskCursor(list(self.by_id), self.config.seed)
        if self.config.warm_start.enabled:
            await self.warm_start(report.kept)

    async def warm_start(self, kept: list[KeptTask]) -> None:
        settings = self.config.warm_start
        samples = warm_start_segments(kept[: settings.max_tasks] if settings.max_tasks else kept)
        if not samples:
            # An agent at its start may reach none: RL starts from the untouched policy, and the summary says so.
            self.warm_start_report = {"source": "agent_runs", "tasks": 0, "skipped": "no synthetic task was reached"}
            return
        trained = await asyncio.to_thread(fine_tune, self.model, samples, settings, self.device, self.config.seed)
        version = await self.policy.load_weights(lora.serving_view(self.model))
        self.warm_start_report = {"source": "agent_runs", "tasks": len(kept), "samples": len(samples),
                                  "assistant_tokens": sum(sum(s.loss_mask) for s in samples), "policy_version": version,
                                  **trained}

    async def evaluate(self, label: str | None = None) -> dict[str, float]:
        """The agent on the held-out tasks (none: nothing to measure); `label` keeps the result for the summary."""
        if self.held_out is None:
            return {}
        started = time.monotonic()
        settings = self.config.eval
        summary = await evaluate_agent(self.evaluator, self.held_out.tasks, k=settings.k,
                                       temperature=eval_sampling(settings, self.config.rollout),
                                       seed=self.config.seed + EVAL_SEED_OFFSET)
        if label:
            self.evaluations[label] = summary
        return {**summary.metrics("eval"), "time/eval_s": time.monotonic() - started}

    async def _evaluate_at_start(self, label: str, when: str, history: list[dict[str, Any]]) -> None:
        metrics = await self.evaluate(label)
        if metrics:
            self.metrics.log(0, metrics)
            history.append({"step": 0, **metrics})
            logger.info("eval {}: avg@{} {:.3f}", when, self.config.eval.k, metrics[f"eval/avg@{self.config.eval.k}"])

    def evaluation_report(self) -> dict[str, Any]:
        """How the held-out episodes were run and how many failed (the agent's errors), beside the gateway's."""
        if self.held_out is None:
            return {"skipped": "no held-out tasks: give agent.eval_tasks (or agent.env, whose eval.split is used)"}
        stats = self.evaluator.stats
        return {"source": self.held_out.source, "tasks": len(self.held_out.tasks), "k": self.config.eval.k,
                # forced by the gateway on every call of a held-out episode, whatever the agent asks for
                "temperature": eval_sampling(self.config.eval, self.config.rollout), "sampling": "gateway",
                "evaluations": list(self.evaluations), "episodes": stats.episodes,
                "failed_episodes": stats.failed_episodes, "errors": stats.errors}

    async def train_step(self) -> dict[str, float]:
        cfg = self.config
        t0 = time.monotonic()
        tasks = [self.by_id[t] for t in self.cursor.next_batch(cfg.tasks_per_step)]
        failed_before, dropped_before = self.runner.stats.failed_episodes, self.runner.stats.dropped_groups
        groups = await self.runner.collect(tasks, cfg.rollout.n)
        if not groups:
            errors = "; ".join(self.runner.stats.errors[-3:]) or "none recorded"
            raise EmptyStepError(f"step {self.step + 1}: every task group had a failed episode; last errors: {errors}")
        t1 = time.monotonic()
        rollouts = [r for g in groups for r in g]
        judgments = await self.mechanisms.label([r.trajectory for r in rollouts])
        batch = StepBatch(groups, judgments or {}, exact_logprobs=False)
        metrics = batch.estimate(cfg.advantage.estimator, cfg.advantage.estimator_config(), self.step)
        trained_version = self.policy.policy_version
        self.records.write(self.step + 1, batch, trained_version=trained_version)
        metrics.update(await asyncio.to_thread(self.updater.update, batch.samples(), policy_version=trained_version))
        version = await self.policy.load_weights(lora.serving_view(self.model))
        await self.mechanisms.after_step([[r.trajectory for r in g] for g in groups], cfg.rollout.env,
                                         request_id=f"{self.run_id}-step{self.step}")
        rewards = [float(r.trajectory.outcome or 0.0) for r in rollouts]
        metrics.update({
            "rollout/reward_mean": float(np.mean(rewards)), "rollout/reward_std": float(np.std(rewards)),
            "rollout/groups": float(len(groups)), "rollout/mixed_outcome_groups": float(mixed_outcome_groups(groups)),
            "rollout/dropped_groups": float(self.runner.stats.dropped_groups - dropped_before),
            "rollout/calls_mean": float(np.mean([len(r.trajectory.steps) for r in rollouts])),
            "rollout/failed_episodes": float(self.runner.stats.failed_episodes - failed_before),
            "rollout/experience_frac": float(np.mean([r.trajectory.experience_flag for r in rollouts])),
            "time/rollout_s": t1 - t0, "time/step_s": time.monotonic() - t0, "policy/version": float(version),
            **self.mechanisms.metrics()})
        self.step += 1
        return metrics

    async def summary(self) -> dict[str, Any]:
        """The run's summary: the gateway episodes (how many merged, failed and why) beside the `mechanisms`
        section in-loop runs write."""
        stats = self.runner.stats
        groups = GroupStats(groups=stats.groups, dropped_groups=stats.dropped_groups,
                            rollouts=stats.episodes - stats.failed_episodes, retrievals=stats.retrievals,
                            last_error=stats.errors[-1] if stats.errors else "")
        mechanisms = await mechanisms_summary(self.mechanisms.tasks, self.mechanisms.experience, self.mechanisms.judge,
                                              self.config.experience.inject, groups, self.config.experience.mode)
        if self.questioning is not None:
            mechanisms.setdefault("self_questioning", {})["agent"] = self.questioning.report.summary()
        evaluated = self.evaluations
        held_out = eval_table(evaluated.get("before"), evaluated.get("after"),
                              split=self.held_out.split if self.held_out is not None else None,
                              warm_start=evaluated.get("warm_start"))
        summary = {"status": "finished", "steps": self.step, "output_dir": str(self.out), "run_id": self.run_id,
                   "dropped_groups": stats.dropped_groups, "rollouts": groups.rollouts,
                   "agent": {**stats.summary(), "eval": self.evaluation_report()}, "eval": held_out,
                   "training": training_signal(self.metrics.records()), "mechanisms": mechanisms}
        if self.warm_start_report is not None:
            summary["warm_start"] = self.warm_start_report
        summary["checks"] = loop_checks(summary)
        return summary

    async def run(self) -> dict[str, Any]:
        await self.setup()
        history = []
        cfg = self.config
        try:
            if cfg.eval.before:
                await self._evaluate_at_start("before", "before training", history)
            if self.questioning is not None:
                await self.question()
            if cfg.evaluates_after_warm_start:
                await self._evaluate_at_start("warm_start", "after the warm start", history)
            while self.step < cfg.steps:
                metrics = await self.train_step()
                if cfg.eval.every and self.step % cfg.eval.every == 0 and self.step < cfg.steps:
                    metrics.update(await self.evaluate())
                if self.step == cfg.steps and cfg.eval.after:
                    metrics.update(await self.evaluate("after"))
                self.metrics.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                logger.info("agent step {}/{}: reward {:.3f}", self.step, self.config.steps,
                            metrics["rollout/reward_mean"])
            summary = await self.summary()
            write_summary(self.out, summary)
            return {**summary, "history": history}
        finally:
            await self.close()

    async def close(self) -> None:
        await self.policy.aclose()
        await self.gateway.aclose()
        if self.env is not None:
            await self.env.aclose()
        await self.mechanisms.aclose()
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
