"""Paired branches (`ask_reward: paired_branch`) against a real env service over HTTP, with a scripted policy
(fixed texts tokenized by the tiny model's real tokenizer): the branch reaches the ask's state by a fork or by
replaying, keeps the sampling seeds, withholds the answer, and its outcome difference lands on the asking
step, where GiGPO turns it into advantages (computed by hand on a 2-rollout group)."""

from __future__ import annotations

import asyncio
import re

import pytest

from common.schemas import Task
from engine.models import load_tokenizer
from env_service.app import build_app
from env_service.settings import EnvServiceSettings
from tests.helpers import InProcessServer
from trainer.asks import AskPolicy, Hit, is_ask
from trainer.branches import BranchRunner, BranchUnsupported, branch_state
from trainer.peers import EnvPeer
from trainer.policy import Generation, Sampling
from trainer.rollout import RolloutConfig, run_episode
from trainer.step_batch import StepBatch

ADVICE = "Repeat the signal word you were shown."
TASK = Task(task_id="signal-train-0000", env_type="signal")


@pytest.fixture(scope="module")
def env_url():
    with InProcessServer(build_app(EnvServiceSettings(environments={"signal": {}}))) as server:
        yield server.url


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


class Advice:
    """Stands in for the experience manager's search (its client is a separate component)."""

    async def search(self, query: str, task_kind: str | None = None) -> list[Hit]:
        return [Hit("exp_1", 0.9, ADVICE)]


class ScriptedPolicy:
    """Turn 0 looks; turn 1 asks when the episode's seed is even; then it answers the signal word when the
    advice is in its context and a wrong word when not. Records each call's turn seed."""

    def __init__(self, tokenizer):
        self.tokenizer, self.seeds = tokenizer, []

    async def generate(self, prompt_ids: list[int], sampling: Sampling) -> Generation:
        self.seeds.append(sampling.seed)
        context = self.tokenizer.decode(prompt_ids)
        episode, turn = divmod(sampling.seed, 1000)
        signal = re.findall(r"The signal is (\w+)", context)
        if turn == 0:
            text = "look"
        elif turn == 1 and episode % 2 == 0:
            text = "<search_experience>what to answer</search_experience>"
        else:
            text = signal[-1] if ADVICE in context else next(w for w in ("north", "south") if w != signal[-1])
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), text, "stop", 0)


def config() -> RolloutConfig:
    return RolloutConfig(env="signal", n=2, max_turns=2, max_new_tokens=32, max_context=512)


@pytest.mark.parametrize("state", ["fork", "replay"])
def test_a_branch_reaches_the_asks_state_and_credits_the_difference_to_the_asking_step(env_url, tokenizer, state):
    asyncio.run(_scenario(env_url, tokenizer, state))


async def _scenario(env_url: str, tokenizer, state: str) -> None:
    env = EnvPeer(env_url)
    try:
        assert branch_state(await env.capabilities("signal"), "auto", "signal") == "fork"
        policy = ScriptedPolicy(tokenizer)
        asks = AskPolicy(Advice(), budget=1, format="tag")
        runner = BranchRunner(env, policy.generate, tokenizer, config(), asks, state=state, share=1.0, seed=0)
        points = runner.points()
        collecting = AskPolicy(Advice(), budget=1, format="tag", on_ask=points.on_ask)
        asking, plain = [await run_episode(TASK, env, policy.generate, tokenizer, config(), group_id="g",
                                           seed=seed, asks=collecting) for seed in (2, 3)]
        assert [s.info.get("ask") is not None for s in asking.trajectory.steps] == [False, True, False]
        assert (asking.trajectory.outcome, plain.trajectory.outcome, plain.asks) == (1.0, 0.0, 0)
        original_seeds = list(policy.seeds[:3])
        policy.seeds.clear()

        metrics = await runner.run([[asking, plain]], {TASK.task_id: TASK}, points)

        assert metrics["experience/branches"] == 1 and metrics["experience/branch_failures"] == 0
        assert metrics["experience/branch_difference_mean"] == 1.0 and metrics["experience/branch_positive_share"] == 1
        assert metrics["experience/branch_forks"] == (1 if state == "fork" else 0)
        # Turns 0 (look) and 1 (the ask) were replayed from the record; turn 2 was sampled with its own seed.
        assert policy.seeds == original_seeds[2:] == [2002]
        ask = asking.trajectory.steps[1]
        assert ask.info["ask"]["branch"] == {"outcome_without": 0.0, "difference": 1.0, "state": state,
                                             "seconds": ask.info["ask"]["branch"]["seconds"]}
        assert runner.counters.branches == 1 and runner.counters.positive == 1
        assert not (await env.client.instances())["instances"]  # the fork and the branch's instance are released

        # The branch itself: the same state at the branch point (after the replayed look), the answer withheld.
        branch = await runner.branch(asking, TASK, points.points[asking.instance_id]) if state == "replay" else None
        if branch is not None:
            assert branch.state_hash_at_branch == branch.state_hash_at_ask is not None
            withheld = branch.trajectory.steps[1]
            assert is_ask(withheld) and withheld.info["ask"]["withheld"] and ADVICE not in withheld.observation.text()
            assert branch.trajectory.steps[0].observation == asking.trajectory.steps[0].observation

        # GiGPO on the 2-rollout group, by hand (gamma 0.95, mean-normalised): step rewards [0, 0, 1] with the
        # credit c = 1 on the ask (step 1), and [0, 0]. Returns: asking 1 + 0.95 = 1.95 at the ask,
        # 0.95 * 1.95 = 1.8525 at step 0, 1 at step 2; plain 0, 0. Anchors: step 0 "initial" for both
        # (+-0.92625), the ask and the plain rollout's answer both act on the cue (+-0.975), step 2 alone (0).
        # Episode part +-0.5.
        batch = StepBatch([[asking, plain]])
        batch.estimate("gigpo", {}, 0)
        want = {0: 0.5 + 0.92625, 1: 0.5 + 0.975, 2: 0.5}, {0: -0.5 - 0.92625, 1: -0.5 - 0.975}
        for rollout, advantages, by_step in zip((asking, plain), batch.advantages, want, strict=True):
            t = rollout.trajectory
            for advantage, step, mask in zip(advantages, t.step_ids, t.loss_mask, strict=True):
                assert advantage == pytest.approx(by_step[step] if mask else 0.0, abs=1e-5)
    finally:
        await env.aclose()


def test_an_environment_that_neither_forks_nor_replays_is_refused_by_name():
    with pytest.raises(BranchUnsupported, match="needs an environment that forks its instances or is deterministic; "
                                                 "environment 'bfcl' declares neither"):
        branch_state({"fork": False, "deterministic": False}, "auto", "bfcl")
    with pytest.raises(BranchUnsupported, match="environment 'flights' is not declared deterministic"):
        branch_state({"fork": True, "deterministic": False}, "replay", "flights")


def test_paired_branch_is_refused_without_asks_or_a_step_level_estimator():  # (veRL: tests/verl/test_overrides.py)
    from trainer.config import TrainerConfig

    base = {"rollout": {"env": "signal"}, "services": {"env_url": "http://127.0.0.1:1", "experience_url": "x",
                                                        "judge_url": "y"}}

    def trainer(mode: str, estimator: str):
        return TrainerConfig.model_validate({**base, "advantage": {"estimator": estimator},
                                             "experience": {"mode": mode, "ask_reward": "paired_branch"}})

    assert trainer("action", "gigpo").experience.branch_share == 0.5
    with pytest.raises(ValueError, match="advantage.estimator=grpo has no steps"):
        trainer("action", "grpo")
    with pytest.raises(ValueError, match="set experience.mode to action"):
        trainer("step", "adca_grpo")


def test_the_local_trainers_step_branches_its_asking_rollouts_before_the_estimator(env_url, tokenizer):
    """`LocalTrainer._collect_step` with the scripted policy: the asks' hook records branch points, every asking
    rollout is branched (share 1), the metrics report it and the step batch carries the credits."""
    from trainer.config import TrainerConfig
    from trainer.local import LocalTrainer, TaskCursor
    from trainer.mechanisms import Mechanisms

    cfg = TrainerConfig.model_validate({
        "rollout": {"env": "signal", "n": 4, "max_turns": 2, "max_new_tokens": 32, "max_context": 512},
        "tasks_per_step": 1, "advantage": {"estimator": "gigpo"},
        "services": {"env_url": env_url, "experience_url": "http://127.0.0.1:9"},  # the pool is `Advice` here
        "experience": {"mode": "action", "ask_budget": 1, "ask_format": "tag", "ask_reward": "paired_branch",
                       "branch_share": 1.0, "branch_state": "replay"}})
    trainer = LocalTrainer(cfg)
    trainer.env, trainer.policy, trainer.tokenizer = EnvPeer(env_url), ScriptedPolicy(tokenizer), tokenizer
    trainer.mechanisms = Mechanisms(estimator="gigpo")
    trainer.asks = AskPolicy(Advice(), budget=1, format="tag")
    trainer.cursor = TaskCursor([TASK.task_id], 0)

    async def step():
        try:
            trainer.branches = await trainer._branch_runner()
            return await trainer._collect_step(0)
        finally:
            await trainer.env.aclose()

    collected = asyncio.run(step())
    rollouts = collected.groups[0]
    asking = [r for r in rollouts if r.asks]
    assert 0 < len(asking) < len(rollouts)  # the seeds of step 0 make some rollouts ask and some not
    assert collected.metrics["experience/branches"] == len(asking)
    assert collected.metrics["experience/branch_difference_mean"] == 1.0
    assert trainer.branches.counters.summary()["branches"] == len(asking)
    result = StepBatch(collected.groups).estimate("gigpo", {}, 0)
    assert result["advantage/credited_steps"] == len(asking)
