"""The agent loop: env create -> (generate -> step)* -> evaluate -> release, with exact tokens.

`run_episode` drives one episode through a context template, given only a `generate(prompt_ids,
sampling)` callable, so the same loop runs under the local trainer, evaluation, and a veRL
AgentLoop. `collect_groups` runs many episodes concurrently (their generations batch in the
policy), injects experience into round(n * eta) rollouts of each group with one retrieval per
group, retries failed rollouts a bounded number of times, and drops a group that still misses
rollouts whole (GRPO never sees a partial group).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from common.schemas import ChatMessage, Step, Task, Trajectory, new_id
from trainer.asks import AskPolicy, EpisodeAsks, environment_steps
from trainer.mechanisms import ExperienceSource, GroupExperience, InjectMode, experience_flags
from trainer.policy import GenerateFn, Generation, Sampling
from trainer.settings import RolloutConfig
from trainer.templates import DemonstrationBudget, Segment, make_template


class EnvAccess(Protocol):
    async def create(self, env: str, task: Task) -> Any: ...
    async def step(self, instance_id: str, action: str) -> Any: ...
    async def evaluate(self, instance_id: str, params: dict[str, Any] | None = None) -> Any: ...
    async def state(self, instance_id: str) -> dict[str, Any] | None: ...
    async def release(self, instance_id: str) -> bool: ...


class SyntheticGrader(Protocol):
    async def grade(self, task: Task, state: dict[str, Any] | None, trajectory: Trajectory) -> float:
        """Outcome in [0, 1] of a synthetic task, from the state snapshot read before release."""


@dataclass
class Rollout:
    """One finished episode: the wire trajectory, its training segments (experience stripped) and the facts
    only training reads, as fields (the trajectory's `metadata` carries what other services read)."""

    trajectory: Trajectory
    segments: list[Segment]
    invalid_steps: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    environment_error: str | None = None  # the environment's error text when the episode ended in one
    environment_error_steps: int = 0
    policy_versions: list[int] = field(default_factory=list)  # the generator's policy version at each turn
    synthetic: bool = False  # the task was synthesized by the task manager
    # What the policy was shown (stripped from the training context): the experience text, or the
    # demonstration as chat turns, and which demonstration it was (its experience id and task kind).
    experience_text: str | None = None
    experience_demonstration: list[dict[str, Any]] | None = None
    demonstration: dict[str, Any] | None = None
    # Asks (experience.mode: action): answered ones, and those over the budget (answered with a refusal).
    asks: int = 0
    asks_over_budget: int = 0
    retrievals: int = 0  # experience.mode: step -- pool searches made for this episode
    # Every turn's generation (asks included) in turn order: the paired branch replays them.
    turn_generations: list[Generation] = field(default_factory=list)
    seed: int | None = None  # the episode's sampling seed: turn t samples with seed * 1000 + t
    instance_id: str | None = None  # the environment instance the episode ran on
    env_host: dict[str, Any] | None = None  # where that instance ran (env_service's `host`: node id, ...)


@dataclass
class GroupStats:
    groups: int = 0
    dropped_groups: int = 0
    failed_attempts: int = 0
    rollouts: int = 0
    retrievals: int = 0
    turns_injected: int = 0  # inject: turns -- rollouts given a demonstration as chat turns
    text_fallbacks: int = 0  # inject: turns -- rollouts given text because no hit had a demonstration
    demos_shortened: int = 0  # inject: turns -- demonstrations shown with observations cut to fit the context
    demos_dropped: int = 0  # inject: turns -- demonstrations too long even cut: the rollout went without
    demos_kind_known: int = 0  # demonstrations shown where the task's and the demonstration's kinds are known
    demos_same_kind: int = 0  # ... and the demonstration was of the task's own kind
    retried_rollouts: int = 0  # attempts after a failed one (a peer outage, a lost env instance)
    # Rollouts whose env instance died with its worker (a Ray actor, or its node), once each however many of
    # their attempts were lost (a retry can land on a worker that is dying too).
    lost_to_env_workers: int = 0
    collected_again: int = 0  # ... rollouts that then finished on another worker
    last_error: str = ""  # the latest rollout failure, named when a step ends up empty
    environment_errors: int = 0  # rollouts that ended in an environment error (the env failed, not the policy)
    asks: int = 0  # experience.mode: action -- answered asks
    asks_over_budget: int = 0  # ... asks refused because the episode's budget was spent
    asking_rollouts: int = 0  # ... rollouts that asked at least once
    step_retrievals: int = 0  # experience.mode: step -- pool searches


def instance_lost(exc: BaseException) -> bool:
    """Whether a rollout failed because its env instance died with the worker holding it (env_service's
    410 `instance_lost`): the episode is collected again on a live worker."""
    return getattr(exc, "code", None) == "instance_lost" or getattr(exc, "status", None) == 410


def environment_error(info: dict[str, Any]) -> str | None:
    """The error text of a step the environment itself failed (it raised, answered 5xx or a value JSON cannot
    carry): env_service reports those as `error.code == "environment_error"`. None for any other step."""
    error = info.get("error")
    if isinstance(error, dict) and error.get("code") == "environment_error":
        return str(error.get("message") or "environment error")
    return None


def is_invalid_action(info: dict[str, Any]) -> bool:
    """Environments report malformed actions as `valid: False`, `invalid: True` or an `error` field; a step
    the environment itself failed is no invalid action (see `environment_error`)."""
    if environment_error(info) is not None:
        return False
    return info.get("valid") is False or bool(info.get("invalid")) or "error" in info


def made_tool_call(steps: Sequence[Any]) -> bool:
    """Whether an episode called a tool: a valid step the environment answered as a tool (an ask of the
    experience pool is not one). A success without one was a guess or a memorised value, not the skill a
    tool-use task asks for."""
    return any(s.observation is not None and s.observation.role == "tool" and not is_invalid_action(s.info)
               for s in environment_steps(steps))


def environment_failure(groups: Sequence[Sequence[Rollout]]) -> str | None:
    """When every rollout of a step ended in an environment error: the last one's text (else None)."""
    rollouts = [r for g in groups for r in g]
    if not rollouts or any(r.environment_error is None for r in rollouts):
        return None
    return rollouts[-1].environment_error


def _align_logprobs(segments: Sequence[Segment], generated_logprobs: list[float]) -> list[float]:
    """Per response token of the concatenated segments: the generating log-prob on policy tokens, else 0.

    Each generated token is a mask-1 token of exactly one segment, in order, so a queue lines them up.
    """
    queue = iter(generated_logprobs)
    return [next(queue, 0.0) if m else 0.0 for s in segments for m in s.loss_mask]


@dataclass
class _Shown:
    """What an episode shows the policy besides its task, stripped again from the training context: the
    experience text, or a demonstration as chat turns (with the budget it must leave), and the ids behind it."""

    text: str | None = None
    ids: list[str] = field(default_factory=list)
    demonstration: list[dict[str, Any]] | None = None
    budget: DemonstrationBudget | None = None
    source: dict[str, Any] | None = None  # the demonstration's experience id and task kind

    @property
    def flagged(self) -> bool:
        return self.text is not None or self.demonstration is not None


@dataclass
class _Played:
    """What an episode's turns produced, in turn order."""

    steps: list[Step] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # every generated token's, turn after turn
    versions: list[int] = field(default_factory=list)  # the generator's policy version at each turn
    generations: list[Generation] = field(default_factory=list)
    generated: int = 0  # generated tokens
    truncated: bool = False
    env_steps: int = 0
    invalid: int = 0
    env_error: str | None = None  # the last environment step's error text, if the environment failed it
    env_error_steps: int = 0

    def add_generation(self, out: Generation) -> None:
        self.generations.append(out)
        self.logprobs += out.logprobs
        self.versions.append(out.policy_version)
        self.generated += len(out.token_ids)

    def add_environment_step(self, turn: int, action: str, result: Any, finish_reason: str,
                             episode_asks: EpisodeAsks | None) -> None:
        self.env_steps += 1
        self.invalid += int(is_invalid_action(result.info))
        self.env_error = environment_error(result.info)
        self.env_error_steps += self.env_error is not None
        info = {**result.info, "finish_reason": finish_reason}
        if episode_asks is not None:
            info = episode_asks.step_info(info)
        self.steps.append(Step(index=turn, action=ChatMessage(role="assistant", content=action),
                               observation=result.observation, reward=result.reward, done=result.done, info=info))


def _task_query(task: Task, messages: Sequence[ChatMessage]) -> str:
    """What experience is looked up by: the task's query, else the environment's last user message."""
    return task.query or next((m.text() for m in reversed(messages) if m.role == "user"), "")


async def _retrieve_experience(experience: GroupExperience, query: str, task_kind: str | None,
                               config: RolloutConfig) -> _Shown:
    """A flagged rollout's experience (the group's one retrieval): its text, or its demonstration as turns."""
    got = await experience.get(query, task_kind)
    if not got:
        return _Shown()
    demo = experience.demonstration_for(got)
    if not demo:
        return _Shown(text=got.text, ids=got.ids)
    return _Shown(ids=got.ids, demonstration=demo,
                  budget=DemonstrationBudget(config.max_new_tokens, config.max_turns,
                                             experience.demonstration_observation_tokens),
                  source={"id": got.demonstration_id, "kind": got.demonstration_kind})


def _start_context(template: Any, chat: list[dict[str, str]], shown: _Shown, experience: GroupExperience | None,
                   task_kind: str | None) -> _Shown:
    """The template's opening context, and what it really shows: a demonstration too long even cut is dropped,
    and the rollout, which then saw no experience, is not flagged."""
    template.start(chat, shown.text, shown.demonstration, shown.budget)
    if experience is None or not shown.demonstration:
        return shown
    experience.record_fit(template.demonstration_fit)
    if template.demonstration_fit == "dropped":
        return _Shown()
    assert shown.source is not None
    experience.record_kind(task_kind, shown.source["kind"])
    return shown


async def _play_turns(template: Any, env: EnvAccess, instance_id: str, generate: GenerateFn, config: RolloutConfig, *,
                      seed: int | None, sampling: Sampling | None, asks: AskPolicy | None,
                      episode_asks: EpisodeAsks | None) -> _Played:
    """The agent loop: generate, answer an ask or step the environment, observe; until the environment ends the
    episode, `max_turns` environment steps are taken, or the context is full (both: truncated)."""
    played = _Played()
    base = sampling or Sampling(max_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p)
    turn_limit = config.max_turns + (asks.extra_turns() if asks is not None else 0)
    for turn in range(turn_limit):
        if played.env_steps >= config.max_turns:  # asks on top of the environment's turns, never instead of them
            played.truncated = True
            break
        budget = template.budget()
        if budget <= 0:
            played.truncated = True
            break
        step_seed = None if seed is None else seed * 1000 + turn
        out = await generate(template.generation_context(),
                             Sampling(max_tokens=min(base.max_tokens, budget), temperature=base.temperature,
                                      top_p=base.top_p, seed=step_seed))
        action = template.add_turn(turn, out.token_ids, out.text)
        played.add_generation(out)
        ask = (await episode_asks.ask(turn, instance_id, out.text, action, out.finish_reason)
               if episode_asks is not None else None)
        if ask is not None:  # answered here: it never reaches the environment
            played.steps.append(ask)
            template.add_observation(ask.observation.text() if ask.observation is not None else None)
            continue
        result = await env.step(instance_id, action)
        played.add_environment_step(turn, action, result, out.finish_reason, episode_asks)
        if result.done:
            template.add_observation(None)
            break
        observation = result.observation.text()
        if episode_asks is not None and played.env_steps < config.max_turns:  # another turn follows
            observation = await episode_asks.observation(observation)
        template.add_observation(observation)
    else:
        played.truncated = True  # max turns reached without the environment ending the episode
    return played


def _trajectory(task: Task, group_id: str | None, config: RolloutConfig, messages: list[ChatMessage],
                played: _Played, shown: _Shown, task_kind: str | None) -> Trajectory:
    """The episode's wire trajectory, before its outcome and token fields."""
    return Trajectory(task_id=task.task_id, group_id=group_id, env_type=config.env,
                      messages=messages + [m for s in played.steps for m in (s.action, s.observation) if m is not None],
                      steps=played.steps, truncated=played.truncated, experience_flag=shown.flagged,
                      experience_ids=shown.ids, policy_version=min(played.versions) if played.versions else 0,
                      # the task's kind: the experience manager files the summary under it
                      metadata={"task_kind": task_kind} if task_kind else {})


async def _outcome(env: EnvAccess, instance_id: str, task: Task, trajectory: Trajectory,
                   grader: SyntheticGrader | None, config: RolloutConfig) -> float:
    """The episode's outcome: a synthetic task is graded by the task manager on the state read before release,
    any other by the environment's own evaluation."""
    if task.synthetic and grader is not None:
        state = await env.state(instance_id)
        return float(await grader.grade(task, state, trajectory))
    return float((await env.evaluate(instance_id, config.evaluate_params)).score)


async def _release(env: EnvAccess, instance_id: str) -> None:
    try:
        await env.release(instance_id)
    except Exception as exc:  # the env service reaps it later; never mask the episode's own error
        logger.warning("release of {} failed: {}", instance_id, exc)


def _set_token_fields(trajectory: Trajectory, segments: list[Segment], prompt_plain: list[int],
                      logprobs: list[float]) -> None:
    """The trajectory's exact token ids, loss mask, step ids and generating log-probs, from its segments."""
    trajectory.prompt_ids = list(segments[0].prompt_ids) if segments else list(prompt_plain)
    trajectory.response_ids = [t for s in segments for t in s.response_ids]
    trajectory.loss_mask = [t for s in segments for t in s.loss_mask]
    trajectory.step_ids = [t for s in segments for t in s.step_ids]
    trajectory.logprobs = _align_logprobs(segments, logprobs)


async def run_episode(task: Task, env: EnvAccess, generate: GenerateFn, tokenizer: Any, config: RolloutConfig, *,
                      experience: GroupExperience | None = None, group_id: str | None = None,
                      seed: int | None = None, grader: SyntheticGrader | None = None,
                      sampling: Sampling | None = None, asks: AskPolicy | None = None) -> Rollout:
    """One episode. Raises on service or generation failures (the caller retries).

    `asks`: the episode reaches the pool itself (`trainer.asks`): the policy asks (mode action; asks are turns
    on top of `max_turns` environment steps, at most the budget) or a retrieval precedes every turn (mode step).
    """
    started = time.monotonic()
    template = make_template(config.template, tokenizer, config.max_context, **config.template_options)
    # 1. The environment instance and its opening messages.
    created = await env.create(config.env, task)
    instance_id = created.instance_id
    try:
        messages = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in created.messages]
        chat = [{"role": m.role, "content": m.text()} for m in messages]
        task_kind = task.metadata.get("task_kind") or None
        # 2. What the policy is shown besides the task: the group's experience (flagged rollouts), the asks' opening.
        shown = (await _retrieve_experience(experience, _task_query(task, messages), task_kind, config)
                 if experience is not None else _Shown())
        episode_asks = EpisodeAsks(asks, _task_query(task, messages), task_kind) if asks is not None else None
        if episode_asks is not None:
            chat = await episode_asks.opening(chat)
        shown = _start_context(template, chat, shown, experience, task_kind)
        # 3. The turns.
        played = await _play_turns(template, env, instance_id, generate, config, seed=seed, sampling=sampling,
                                   asks=asks, episode_asks=episode_asks)
        # 4. The outcome, read before the instance goes.
        trajectory = _trajectory(task, group_id, config, messages, played, shown, task_kind)
        trajectory.outcome = await _outcome(env, instance_id, task, trajectory, grader, config)
    finally:
        # 5. The instance goes back, whatever happened.
        await _release(env, instance_id)
    # 6. The exact tokens for training.
    segments = template.segments()
    _set_token_fields(trajectory, segments, template.prompt_plain, played.logprobs)
    return Rollout(trajectory, segments, played.invalid, played.generated, time.monotonic() - started,
                   environment_error=played.env_error, environment_error_steps=played.env_error_steps,
                   policy_versions=played.versions, synthetic=task.synthetic, experience_text=shown.text,
                   experience_demonstration=shown.demonstration, demonstration=shown.source,
                   turn_generations=played.generations, seed=seed, instance_id=instance_id,
                   env_host=getattr(created, "host", None),
                   **(episode_asks.counts() if episode_asks is not None else {}))


async def collect_groups(tasks: Sequence[Task], env: EnvAccess, generate: GenerateFn, tokenizer: Any,
                         config: RolloutConfig, *, experience: ExperienceSource | None = None,
                         grader: SyntheticGrader | None = None, seed: int = 0,
                         stats: GroupStats | None = None, sampling: Sampling | None = None,
                         n: int | None = None, on_rollout: Callable[[Rollout], None] | None = None,
                         inject: InjectMode = "text",
                         demonstration_observation_tokens: int = 96,
                         asks: AskPolicy | None = None) -> list[list[Rollout]]:
    """n rollouts per task, concurrently; returns the complete groups only (in task order).

    `asks`: every rollout reaches the pool itself (experience.mode action or step; see `run_episode`).

    `on_rollout` is called once per finished rollout (progress), in completion order.
    `demonstration_observation_tokens`: inject: turns -- the cap on each demonstration observation when
    the demonstration does not fit the context whole.
    """
    stats = stats if stats is not None else GroupStats()
    n = n or config.n
    limit = asyncio.Semaphore(config.concurrency)
    rng = random.Random(seed)

    async def attempt(task: Task, group_id: str, group_exp: GroupExperience | None, rollout_seed: int) -> Rollout:
        last: BaseException | None = None
        lost = False
        for tries in range(config.retries + 1):
            if tries:
                stats.retried_rollouts += 1
            async with limit:
                try:
                    rollout = await run_episode(task, env, generate, tokenizer, config, experience=group_exp,
                                                group_id=group_id, seed=rollout_seed + 7919 * tries, grader=grader,
                                                sampling=sampling, asks=asks)
                except Exception as exc:  # service down, timeout, engine failure: bounded retry
                    last = exc
                    stats.failed_attempts += 1
                    stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
                    if instance_lost(exc) and not lost:
                        stats.lost_to_env_workers += 1
                        lost = True
                    logger.warning("rollout of {} failed (attempt {}/{}): {}", task.task_id, tries + 1,
                                   config.retries + 1, exc)
                    continue
            stats.collected_again += lost
            stats.asks += rollout.asks
            stats.asks_over_budget += rollout.asks_over_budget
            stats.asking_rollouts += rollout.asks > 0
            stats.step_retrievals += rollout.retrievals
            if rollout.environment_error is not None:
                stats.environment_errors += 1
                stats.last_error = f"environment error: {rollout.environment_error}"[:500]
            if on_rollout is not None:
                on_rollout(rollout)
            return rollout
        assert last is not None
        raise last

    async def group(task: Task) -> list[Rollout] | None:
        group_id = new_id("grp")
        shared = (GroupExperience(experience, inject, demonstration_observation_tokens)
                  if experience is not None else None)
        flags = experience_flags(n, config.experience_ratio if experience is not None else 0.0)
        seeds = [rng.randrange(2**31) for _ in range(n)]
        results = await asyncio.gather(
            *(attempt(task, group_id, shared if flags[i] else None, seeds[i]) for i in range(n)),
            return_exceptions=True)
        stats.groups += 1
        if shared is not None:
            stats.retrievals += shared.retrievals
            stats.turns_injected += shared.turns_injected
            stats.text_fallbacks += shared.text_fallbacks
            stats.demos_shortened += shared.demos_shortened
            stats.demos_dropped += shared.demos_dropped
            stats.demos_kind_known += shared.demos_kind_known
            stats.demos_same_kind += shared.demos_same_kind
        if any(isinstance(r, BaseException) for r in results):
            stats.dropped_groups += 1
            logger.warning("dropping group of task {}: {} of {} rollouts failed", task.task_id,
                           sum(isinstance(r, BaseException) for r in results), n)
            return None
        stats.rollouts += n
        return list(results)  # type: ignore[arg-type]

    groups = await asyncio.gather(*(group(t) for t in tasks))
    return [g for g in groups if g is not None]


@dataclass
class EvalSummary:
    avg_at_k: float
    best_at_k: float
    invalid_action_rate: float
    tasks: int
    k: int
    per_task: dict[str, list[float]] = field(default_factory=dict)  # outcome of each of the k samples
    per_task_invalid: dict[str, float] = field(default_factory=dict)  # invalid steps / steps, per task
    per_task_answer: dict[str, str] = field(default_factory=dict)  # the first sample's last action text
    # Audit of what the policy was shown: the sha256 of each task's first prompt (token ids, the same for
    # every sample of a task) and how many samples were given experience (evaluation gives none).
    per_task_prompt: dict[str, str] = field(default_factory=dict)
    experience_rollouts: int = 0
    # Environment steps of each sample: a one-call lookup solved in 1 step was answered without any call
    # (a guess or a memorised value), in 2 after one call.
    per_task_steps: dict[str, list[int]] = field(default_factory=dict)
    # Every sample's last action text, in sample order: a stricter grader can be applied afterwards.
    per_task_replies: dict[str, list[str]] = field(default_factory=dict)
    # Whether each sample's episode made at least one valid tool call, in sample order.
    per_task_called: dict[str, list[bool]] = field(default_factory=dict)
    success_threshold: float = 1.0
    # Evaluated with asks (experience.mode action/step): whether each sample asked, in sample order.
    with_asks: bool = False
    per_task_asked: dict[str, list[bool]] = field(default_factory=dict)
    # Episodes that ended in an environment error (the environment failed, not the policy), of all episodes.
    environment_error_rate: float = 0.0

    def ask_split(self) -> dict[str, float]:
        """With asks: the share of samples that asked, and the success rate of those that did and did not."""
        pairs = [(score >= self.success_threshold, asked) for task_id, scores in self.per_task.items()
                 for score, asked in zip(scores, self.per_task_asked.get(task_id, []), strict=False)]
        if not pairs:
            return {}
        out = {"ask_rate": sum(a for _, a in pairs) / len(pairs)}
        for name, side in (("success_asked", True), ("success_not_asked", False)):
            chosen = [ok for ok, a in pairs if a == side]
            if chosen:
                out[name] = sum(chosen) / len(chosen)
        return out

    def successes_with_tool_call(self) -> float | None:
        """The share of successful samples whose episode called a tool (None: no success, or not recorded)."""
        pairs = [(score >= self.success_threshold, called) for task_id, scores in self.per_task.items()
                 for score, called in zip(scores, self.per_task_called.get(task_id, []), strict=False)]
        called = [c for ok, c in pairs if ok]
        return sum(called) / len(called) if called else None

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {f"{prefix}/avg@{self.k}": self.avg_at_k, f"{prefix}/best@{self.k}": self.best_at_k,
               f"{prefix}/invalid_action_rate": self.invalid_action_rate,
               f"{prefix}/environment_error_rate": self.environment_error_rate, f"{prefix}/tasks": float(self.tasks)}
        share = self.successes_with_tool_call()
        if share is not None:
            out[f"{prefix}/successes_with_tool_call"] = share
        if self.with_asks:
            out.update({f"{prefix}/{name}": value for name, value in self.ask_split().items()})
        return out


# Added to the run's seed for held-out samples, in-loop and gateway alike: they draw apart from training's.
EVAL_SEED_OFFSET = 17


async def evaluate_policy(tasks: Sequence[Task], env: EnvAccess, generate: GenerateFn, tokenizer: Any,
                          config: RolloutConfig, *, k: int = 1, greedy: bool = True, seed: int = 0,
                          success_threshold: float = 1.0,
                          on_rollout: Callable[[Rollout], None] | None = None,
                          asks: AskPolicy | None = None) -> EvalSummary:
    """avg@k (mean success over k samples per task) and best@k (a task counts if any sample succeeds),
    with the invalid-action rate beside them so format fixes are not mistaken for skill.

    `on_rollout` is called once per finished episode (progress). `asks`: the policy may ask the pool (or a
    retrieval precedes every turn); off by default, and the pool must hold train-split content only
    (`trainer.asks.refuse_held_out`)."""
    sampling = Sampling(max_tokens=config.max_new_tokens, temperature=0.0 if greedy else config.temperature,
                        top_p=config.top_p)
    eval_config = config.model_copy(update={"experience_ratio": 0.0})
    groups = await collect_groups(tasks, env, generate, tokenizer, eval_config, seed=seed, sampling=sampling, n=k,
                                  on_rollout=on_rollout, asks=asks)
    episodes = [episode_result(r) for g in groups for r in g]
    summary = summarize_episodes(episodes, k, success_threshold)
    summary.with_asks = asks is not None
    return summary


def episode_result(rollout: Rollout) -> EpisodeResult:
    """What an evaluation keeps of a rollout; its steps are the environment's (asks counted apart)."""
    t = rollout.trajectory
    env_steps = environment_steps(t.steps)
    return EpisodeResult(t.task_id, float(t.outcome or 0.0), len(env_steps), rollout.invalid_steps,
                         env_steps[-1].action.text() if env_steps else "", made_tool_call(t.steps),
                         prompt_digest(t.prompt_ids), t.experience_flag, rollout.asks,
                         rollout.environment_error is not None)


@dataclass
class EpisodeResult:
    """What an evaluation keeps of one episode."""

    task_id: str
    outcome: float
    steps: int
    invalid_steps: int
    reply: str  # the last action's text ("" without a step)
    called_tool: bool  # whether the episode made at least one valid tool call
    prompt: str | None = None  # prompt_digest of its first prompt, where the policy was given token ids
    with_experience: bool = False
    asks: int = 0  # answered asks of the experience pool (not among `steps`)
    environment_error: bool = False  # the episode ended in an environment error


def summarize_episodes(episodes: Sequence[EpisodeResult], k: int, success_threshold: float = 1.0) -> EvalSummary:
    """avg@k (mean success over the k samples of a task), best@k (a task counts if any sample succeeds) and the
    invalid-action rate, with each task's records, in the order of `episodes`."""
    per_task: dict[str, list[float]] = {}
    task_steps: dict[str, int] = {}
    task_invalid: dict[str, int] = {}
    answers: dict[str, str] = {}
    prompts: dict[str, str] = {}
    lengths: dict[str, list[int]] = {}
    replies: dict[str, list[str]] = {}
    called: dict[str, list[bool]] = {}
    asked: dict[str, list[bool]] = {}
    with_experience = 0
    for e in episodes:
        asked.setdefault(e.task_id, []).append(e.asks > 0)
        per_task.setdefault(e.task_id, []).append(e.outcome)
        if e.prompt is not None:
            prompts.setdefault(e.task_id, e.prompt)
        with_experience += int(e.with_experience)
        task_steps[e.task_id] = task_steps.get(e.task_id, 0) + e.steps
        lengths.setdefault(e.task_id, []).append(e.steps)
        task_invalid[e.task_id] = task_invalid.get(e.task_id, 0) + e.invalid_steps
        replies.setdefault(e.task_id, []).append(e.reply)
        called.setdefault(e.task_id, []).append(e.called_tool)
        if e.task_id not in answers and e.steps:
            answers[e.task_id] = e.reply
    if not per_task:
        return EvalSummary(0.0, 0.0, 0.0, 0, k)
    success = {t: [float(s >= success_threshold) for s in v] for t, v in per_task.items()}
    avg = sum(sum(v) / len(v) for v in success.values()) / len(success)
    best = sum(max(v) for v in success.values()) / len(success)
    invalid_rate = sum(task_invalid.values()) / max(sum(task_steps.values()), 1)
    per_task_invalid = {t: task_invalid[t] / max(task_steps[t], 1) for t in per_task}
    return EvalSummary(avg, best, invalid_rate, len(success), k, per_task, per_task_invalid, answers, prompts,
                       with_experience, lengths, replies, called, success_threshold, per_task_asked=asked,
                       environment_error_rate=sum(e.environment_error for e in episodes) / len(episodes))


def prompt_digest(token_ids: Sequence[int]) -> str:
    """A short stable fingerprint of a prompt's token ids (equal digests: the same prompt)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def rollout_progress(total: int, started: float, what: str = "rollouts", every: int = 1) -> Callable[[Rollout], None]:
    """An `on_rollout` reporter: a log line every `every` finished rollouts and at the last, with tokens/s."""
    done, tokens = 0, 0

    def report(rollout: Rollout) -> None:
        nonlocal done, tokens
        done, tokens = done + 1, tokens + rollout.generated_tokens
        if done % every == 0 or done == total:
            logger.info("{} {}/{}: {:.1f} tokens/s", what, done, total, tokens / max(time.monotonic() - started, 1e-9))

    return report


def evaluation_progress(episodes: int, started: float) -> Callable[[Rollout], None]:
    """A held-out evaluation can be most of a CPU run: say how far it is, about 8 times."""
    return rollout_progress(episodes, started, what="evaluation episodes", every=max(1, episodes // 8))
