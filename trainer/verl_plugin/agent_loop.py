"""`evolver_env_agent`: a veRL agent loop that runs our `trainer.rollout.run_episode` against env_service.

veRL's rollout worker instantiates it per sample and awaits `run`. There is no second agent loop
here: veRL's `server_manager.generate` (token ids in, token ids out, vLLM/SGLang behind it) is
adapted to the `generate(prompt_ids, sampling)` callable our loop takes, and the env service, the
experience manager and the judge are called through their own clients. What comes back to veRL:
- `prompt_ids`: the prompt **without** injected experience (the actor recomputes log-probs on it);
- `response_ids` / `response_mask`: the generated ids exactly as sampled (mask 1) and the chat glue
  and observations between turns (mask 0);
- `reward_score`: the environment's evaluation (the task manager's grade for a synthetic task);
  `extra_fields`: task id, `experience_flag`, step ids (per response token), anchor states,
  trajectory/segment ids and the finished trajectory (first segment) for `evolver_sync`, which adds the
  judge's labels once per batch.
A template that rewrites its context (sliding_window, self_managed) yields several segments: one
`AgentLoopOutput` each (veRL's v1 path trains each as a row and copies the reward to all).

With `experience.mode` action or step every session reaches the pool itself through the `AskPolicy` the local
trainer builds (`trainer.asks`): the policy's asks (or a search before every turn) are answered in the context,
kept in the training sample with mask 0; `extra_fields` counts them (`asks`, `asks_over_budget`) and the
trajectory's ask steps carry the queries and hits, which `evolver_sync` reports to the pool as usage feedback.

Validation rows (the row key `evolver_validate`, put on them by `evolver_sync`) run with neither: no
experience flag, no asks, as the local trainer's evaluation.

The mechanisms are the same as the local trainer's (`trainer.mechanisms`): session `i` of a prompt's
`rollout.n` sessions is given experience by the flag rule `experience_flags`; the flagged sessions of a
prompt (one `uid`) share one retrieval, made by the first of them; a synthetic task is graded by the task
manager. Judging, summarization and feedback happen once per batch in `evolver_sync`, which reads the
finished trajectory from `extra_fields["trajectory"]`.
Log-probs: `response_logprobs` are the generating policy's. For a flagged session they were computed
with the experience in context, while the training prompt has it removed; `evolver_sync` therefore
replaces them by the actor's recomputation on the stripped prompt (`old_log_probs`) before rollout
correction, so an unchanged policy has importance weight 1 on every row.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from common.schemas import Task
from estimators.segments import split_row
from trainer.asks import Hit, ask_policy
from trainer.mechanisms import GroupExperience, experience_flags
from trainer.peers import EnvPeer, ExperiencePeer, Retrieved, TaskPeer
from trainer.policy import Generation, Sampling
from trainer.rollout import Rollout, run_episode
from trainer.verl_plugin.settings import (
    TASK_KEY,
    VALIDATION_KEY,
    VERL_AGENT_LOOP,
    EvolverVerlSettings,
    ExperienceSettings,
    evolver_settings,
)


def task_from_row(row: dict[str, Any]) -> Task:
    """The Task a dataset row stands for (`extra_info.evolver_task`, written by `trainer.verl_plugin dataset`)."""
    info = row.get("extra_info") or {}
    raw = info.get(TASK_KEY) if isinstance(info, dict) else None
    if raw is None:
        raise ValueError(f"dataset row has no extra_info.{TASK_KEY}; build the parquet with "
                         "`python -m trainer.verl_plugin dataset ...`")
    return Task.model_validate(json.loads(raw) if isinstance(raw, str) else raw)


class ServerGenerate:
    """veRL's `server_manager.generate` as our `GenerateFn`; one sticky request id per episode."""

    def __init__(self, server_manager: Any, tokenizer: Any, sampling_params: dict[str, Any]) -> None:
        self.server_manager, self.tokenizer = server_manager, tokenizer
        self.base = dict(sampling_params)
        self.request_id = uuid4().hex  # same id every turn: the server keeps routing to its prefix cache
        self.global_steps: list[int] = []
        self.logprobs_missing = False

    async def __call__(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        # A fresh dict each call: veRL's servers pop keys from the one they are given.
        params = {**self.base, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                  "top_p": sampling.top_p}
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        out = await self.server_manager.generate(request_id=self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=params)
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None or len(out.log_probs) != len(ids):
            self.logprobs_missing = True
            logprobs = [0.0] * len(ids)
        else:
            logprobs = [float(x) for x in out.log_probs]
        version = (out.extra_fields or {}).get("global_steps")
        if version is not None:
            self.global_steps.append(int(version))
        finish = "length" if len(ids) >= sampling.max_tokens else "stop"
        return Generation(ids, logprobs, self.tokenizer.decode(ids, skip_special_tokens=True), finish,
                          int(version or 0))


class FreshExperienceRetrieval:
    """`ExperienceSource` opening its own client per call (rollout workers have no long-lived peer);
    called once per task group through `GroupExperience`."""

    def __init__(self, settings: ExperienceSettings, timeout: float, outage: Any = None) -> None:
        self.settings, self.timeout, self.outage = settings, timeout, outage

    async def retrieve(self, query: str, task_kind: str | None = None) -> Retrieved | None:
        peer = self._peer()
        try:
            return await peer.retrieve(query, task_kind)
        finally:
            await peer.aclose()

    async def search(self, query: str, task_kind: str | None = None) -> list[Hit]:
        """An ask's search (`trainer.asks.AskSource`)."""
        peer = self._peer()
        try:
            return await peer.search(query, task_kind)
        finally:
            await peer.aclose()

    def _peer(self) -> ExperiencePeer:
        s = self.settings
        return ExperiencePeer(s.url, s.workspace, top_k=s.top_k, min_similarity=s.min_similarity,
                              timeout=self.timeout, outage=self.outage)


# uid -> the group's shared retrieval, in this rollout worker process (a prompt's sessions run together).
_GROUPS: OrderedDict[str, GroupExperience] = OrderedDict()
_GROUPS_KEPT = 4096


def group_experience(uid: str, settings: EvolverVerlSettings) -> GroupExperience:
    """The one retrieval of task group `uid`, shared by its flagged sessions."""
    assert settings.experience is not None
    group = _GROUPS.get(uid)
    if group is None:
        group = _GROUPS[uid] = GroupExperience(FreshExperienceRetrieval(settings.experience, settings.timeout_s,
                                                                           settings.outage()),
                                               settings.experience.inject,
                                               settings.experience.demonstration_observation_tokens)
        while len(_GROUPS) > _GROUPS_KEPT:
            _GROUPS.popitem(last=False)
    return group


def outputs_from_rollout(rollout: Rollout, generate: ServerGenerate, response_length: int,
                         metrics: AgentLoopMetrics) -> list[AgentLoopOutput]:
    """One AgentLoopOutput per training segment, experience-free prompts, per-token step ids."""
    traj = rollout.trajectory
    # `step_labels`: the judge's, put in once per batch by `evolver_sync` (VerlMechanisms.label_batch).
    shared = {
        "task_id": traj.task_id, "trajectory_id": traj.trajectory_id, "experience_flag": traj.experience_flag,
        "experience_ids": list(traj.experience_ids), "step_labels": None, "num_steps": len(traj.steps),
        "step_rewards": [s.reward for s in traj.steps],
        "anchor_keys": _anchor_keys(traj), "truncated": traj.truncated, "num_segments": len(rollout.segments),
        "asks": rollout.asks, "asks_over_budget": rollout.asks_over_budget,
        "min_global_steps": min(generate.global_steps) if generate.global_steps else None,
        "max_global_steps": max(generate.global_steps) if generate.global_steps else None,
    }
    # The finished episode without its token lists, for the judge and the feedback (on the first segment only).
    record = traj.model_dump_json(exclude={"prompt_ids", "response_ids", "loss_mask", "step_ids", "logprobs"})
    logprob_parts = split_row(traj.logprobs or [], [len(s.response_ids) for s in rollout.segments])
    outputs: list[AgentLoopOutput] = []
    for index, segment in enumerate(rollout.segments):
        n = len(segment.response_ids)
        logprobs = None if generate.logprobs_missing else logprob_parts[index][:response_length]
        outputs.append(AgentLoopOutput(
            prompt_ids=list(segment.prompt_ids),
            response_ids=segment.response_ids[:response_length],
            response_mask=segment.loss_mask[:response_length],
            response_logprobs=logprobs,
            reward_score=float(traj.outcome if traj.outcome is not None else 0.0),
            num_turns=1 + 2 * len(traj.steps),
            metrics=metrics,
            # veRL copies `reward_extra_info` from the last output to the others: every output carries it.
            extra_fields={**shared, "segment_index": index, "step_ids": segment.step_ids[:response_length],
                          "trajectory": record if index == 0 else None,
                          "response_truncated": n > response_length,
                          "reward_extra_info": {"outcome": float(traj.outcome or 0.0)}},
        ))
    return outputs


def _anchor_keys(trajectory: Any) -> list[str]:
    from estimators import anchor_keys_for

    return anchor_keys_for(trajectory)


@register(VERL_AGENT_LOOP)
class EvolverEnvAgentLoop(AgentLoopBase):
    """Runs one episode of a task on env_service per call (see the module doc)."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        # veRL always passes `tools`; the environment service owns the tools here.
        super().__init__(*args, **kwargs)
        self.settings = evolver_settings(self.config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        settings = self.settings
        task = task_from_row(kwargs)
        n = int(kwargs.get("__rollout_n__") or self.rollout_config.n)
        session_id = int(kwargs.get("session_id", 0))
        uid = str(kwargs.get("uid", task.task_id))
        # Validation (held-out) rollouts measure the policy alone: no injected experience and no asks.
        experience = None if kwargs.get(VALIDATION_KEY) else settings.experience
        ratio = settings.rollout.experience_ratio if experience is not None else 0.0
        flagged = experience_flags(n, ratio)[session_id] if session_id < n else False
        asks = (ask_policy(experience, FreshExperienceRetrieval(experience, settings.timeout_s, settings.outage()),
                           self.tokenizer)
                if experience is not None else None)
        generate = ServerGenerate(self.server_manager, self.tokenizer, sampling_params)
        sampling = Sampling(max_tokens=settings.rollout.max_new_tokens,
                            temperature=float(sampling_params.get("temperature", settings.rollout.temperature)),
                            top_p=float(sampling_params.get("top_p", settings.rollout.top_p)))
        grader = (TaskPeer(settings.tasks.url, timeout=settings.timeout_s, outage=settings.outage())
                  if task.synthetic and settings.tasks is not None else None)
        started = time.monotonic()
        env = EnvPeer(settings.env_url, timeout=settings.timeout_s, outage=settings.outage())
        try:
            rollout = await run_episode(task, env, generate, self.tokenizer, settings.rollout,
                                        experience=group_experience(uid, settings) if flagged else None,
                                        group_id=uid, sampling=sampling, grader=grader, asks=asks)
        finally:
            await env.aclose()
            if grader is not None:
                await grader.aclose()
        metrics = AgentLoopMetrics(generate_sequences=time.monotonic() - started)
        return outputs_from_rollout(rollout, generate, int(self.rollout_config.response_length), metrics)
