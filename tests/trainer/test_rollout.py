"""The agent loop against a real env service over HTTP, with the tiny model behind the batching engine."""

from __future__ import annotations

import asyncio

import pytest
import torch

from common.http import ServiceCallError
from common.schemas import Task
from engine.models import load_model
from tests.helpers import run_env_service
from trainer.loss import PolicyLossConfig, policy_loss
from trainer.peers import EnvPeer
from trainer.policy import InProcessPolicy, Sampling
from trainer.rollout import GroupStats, RolloutConfig, collect_groups, run_episode
from trainer.templates import EXP_OPEN
from trainer.update import OptimConfig, PolicyUpdater, TrainSample, collate, response_logprobs

ENV_YAML = "env_service:\n  environments:\n    signal: {fallback: first_char}\n"


@pytest.fixture(scope="module")
def env_url(tmp_path_factory):
    with run_env_service(ENV_YAML, tmp_path_factory.mktemp("env")) as service:
        yield service.url


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


class RecordingPolicy:
    """The real in-process policy; remembers every context it was asked to continue."""

    def __init__(self, model, tokenizer, fail_when=None):
        self.inner = InProcessPolicy(model, tokenizer, max_batch=64, threads=1)
        self.contexts: list[list[int]] = []
        self.outputs: list[list[int]] = []
        self.fail_when = fail_when

    async def generate(self, prompt_ids, sampling):
        if self.fail_when is not None and self.fail_when(prompt_ids):
            raise RuntimeError("injected generation failure")
        out = await self.inner.generate(prompt_ids, sampling)
        self.contexts.append(list(prompt_ids))
        self.outputs.append(list(out.token_ids))
        return out


class FixedExperience:
    """Stands in for the experience manager's retrieval (its client is a separate component)."""

    def __init__(self, text):
        self.text, self.queries = text, []

    async def retrieve(self, query):
        self.queries.append(query)
        return self.text, ["exp_1"]


def config(**kw):
    base = dict(env="signal", n=4, max_turns=4, max_new_tokens=3, max_context=256, retries=1)
    return RolloutConfig(**{**base, **kw})


async def _with_env(env_url, fn):
    env = EnvPeer(env_url)
    try:
        return await fn(env)
    finally:
        await env.aclose()


def test_episode_keeps_exact_tokens_masks_and_step_ids(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)

    async def go(env):
        task = Task(task_id="signal-train-0000", env_type="signal")
        return await run_episode(task, env, policy.generate, tok, config(), seed=3)

    rollout = asyncio.run(_with_env(env_url, go))
    asyncio.run(policy.inner.aclose())
    traj = rollout.trajectory
    assert len(traj.steps) == 2 and traj.steps[-1].done and not traj.truncated
    assert traj.outcome in (0.0, 1.0)
    # Generated ids, in order, are exactly the mask-1 tokens: nothing was re-tokenized.
    generated = [t for out in policy.outputs for t in out]
    assert [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m] == generated
    # Step ids: turn 0's tokens (its generation and the observation after it) are 0, then 1.
    first = len(policy.outputs[0])
    assert traj.step_ids[:first] == [0] * first
    assert set(traj.step_ids) == {0, 1}
    obs_tokens = [i for i, m in enumerate(traj.loss_mask) if not m]
    assert obs_tokens and traj.step_ids[obs_tokens[0]] == 0 and traj.step_ids[-1] == 1
    # The observation ("... The signal is <word>") appears in the response with mask 0.
    signal_word = traj.steps[0].observation.text().split()[-1]
    word_id = tok.encode(" " + signal_word, add_special_tokens=False)
    masked = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m]
    assert all(w in masked for w in word_id)
    # The second generation continued from prompt + first turn + observation, token for token.
    assert policy.contexts[1] == traj.prompt_ids + traj.response_ids[:len(policy.contexts[1]) - len(traj.prompt_ids)]
    assert len(traj.logprobs) == len(traj.response_ids)
    assert traj.policy_version == 0


def test_observation_tokens_get_zero_gradient(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)

    async def go(env):
        return await run_episode(Task(task_id="signal-train-0001", env_type="signal"), env, policy.generate, tok,
                                 config(), seed=5)

    rollout = asyncio.run(_with_env(env_url, go))
    asyncio.run(policy.inner.aclose())
    [seg] = rollout.segments
    sample = TrainSample(seg.prompt_ids, seg.response_ids, seg.loss_mask, [1.0] * len(seg.response_ids))
    batch = collate([sample], pad_id=0, device=torch.device("cpu"))
    logp, _ = response_logprobs(model, batch)
    loss, _ = policy_loss(logp, logp.detach(), batch.advantages, batch.mask, None, PolicyLossConfig())
    # d loss / d logp: what each response token's log-prob contributes to the update.
    grad_logp = torch.autograd.grad(loss, logp)[0][0]
    mask = torch.tensor(seg.loss_mask, dtype=torch.bool)
    assert torch.all(grad_logp[~mask] == 0) and torch.all(grad_logp[mask] != 0)


def test_old_logprobs_on_the_training_context_match_the_generator(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)

    async def go(env):
        tasks = [Task(task_id=f"signal-train-{i:04d}", env_type="signal") for i in range(2)]
        return await collect_groups(tasks, env, policy.generate, tok, config(n=2), seed=1)

    groups = asyncio.run(_with_env(env_url, go))
    asyncio.run(policy.inner.aclose())
    for rollout in (r for g in groups for r in g):
        traj = rollout.trajectory
        sample = TrainSample(traj.prompt_ids, traj.response_ids, traj.loss_mask, [0.0] * len(traj.response_ids))
        with torch.no_grad():
            logp, _ = response_logprobs(model, collate([sample], 0, torch.device("cpu")))
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        assert torch.allclose(logp[0][mask], torch.tensor(traj.logprobs)[mask], atol=1e-3)


def test_experience_goes_to_round_n_eta_rollouts_with_one_retrieval_and_is_stripped(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)
    source = FixedExperience("Remember the last word you are shown.")
    stats = GroupStats()

    async def go(env):
        tasks = [Task(task_id=f"signal-train-{i:04d}", env_type="signal") for i in range(2)]
        return await collect_groups(tasks, env, policy.generate, tok, config(n=4, experience_ratio=0.5),
                                    experience=source, stats=stats, seed=2)

    groups = asyncio.run(_with_env(env_url, go))
    asyncio.run(policy.inner.aclose())
    assert stats.retrievals == 2 and len(source.queries) == 2  # one retrieval per group
    assert "answer with its word" in source.queries[0]  # the task's own query text
    exp_ids = tok.encode(EXP_OPEN, add_special_tokens=False)
    for group in groups:
        assert [r.trajectory.experience_flag for r in group].count(True) == round(4 * 0.5)
        for r in group:
            text = tok.decode(r.trajectory.prompt_ids + r.trajectory.response_ids)
            assert "Remember the last word" not in text and EXP_OPEN not in text
    # The policy did see the experience for exactly the flagged rollouts' turns.
    seen = [c for c in policy.contexts if _contains(c, exp_ids)]
    assert len(seen) == 2 * 2 * 2  # 2 groups x 2 flagged rollouts x 2 turns
    # And the generated ids of a flagged rollout are reused unchanged in its stripped sample.
    flagged = next(r for g in groups for r in g if r.trajectory.experience_flag)
    assert flagged.trajectory.experience_ids == ["exp_1"]
    sample_generated = [t for t, m in zip(flagged.trajectory.response_ids, flagged.trajectory.loss_mask, strict=True)
                        if m]
    assert _contains_run(policy.outputs, sample_generated)


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def _contains_run(outputs, generated):
    return any(outputs[i] + outputs[i + 1] == generated for i in range(len(outputs) - 1)) or \
        any(a + b == generated for a in outputs for b in outputs)


def test_failed_rollouts_are_retried_then_their_group_is_dropped_whole(env_url, tiny):
    model, tok = tiny
    flaky = {"left": 1}

    def fail_when(_prompt):
        if flaky["left"] > 0:  # the first generation fails once: a retry recovers it
            flaky["left"] -= 1
            return True
        return False

    policy = RecordingPolicy(model, tok, fail_when=fail_when)
    stats = GroupStats()
    doomed = "signal-train-0002"

    class BrokenForOneTask(EnvPeer):
        async def create(self, env, task):
            if task.task_id == doomed:
                raise ConnectionError("environment unavailable for this task")
            return await super().create(env, task)

    async def go():
        env = BrokenForOneTask(env_url)
        try:
            tasks = [Task(task_id=f"signal-train-{i:04d}", env_type="signal") for i in range(3)]
            return await collect_groups(tasks, env, policy.generate, tok, config(n=3, retries=2), stats=stats)
        finally:
            await env.aclose()

    groups = asyncio.run(go())
    asyncio.run(policy.inner.aclose())
    assert [g[0].trajectory.task_id for g in groups] == ["signal-train-0000", "signal-train-0001"]
    assert all(len(g) == 3 for g in groups)
    assert stats.dropped_groups == 1 and stats.groups == 3
    assert stats.failed_attempts == 1 + 3 * 3  # one flaky generation + 3 rollouts x 3 attempts on the doomed task


def test_a_rollout_lost_with_its_env_worker_twice_counts_once_and_is_collected_again(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)
    stats = GroupStats()

    class WorkerDiesTwice(EnvPeer):
        """Its first two instances die with their worker mid-episode: a retry can land on a dying worker too."""

        doomed = 2

        async def step(self, instance_id, action):
            if self.doomed:
                self.doomed -= 1
                raise ServiceCallError(f"/v1/instances/{instance_id}/step", 410, "instance_lost",
                                       f"instance {instance_id!r} was lost: its Ray actor died; create a new one")
            return await super().step(instance_id, action)

    async def go():
        env = WorkerDiesTwice(env_url)
        try:
            task = Task(task_id="signal-train-0004", env_type="signal")
            return await collect_groups([task], env, policy.generate, tok, config(n=1, max_turns=1, retries=2),
                                        stats=stats)
        finally:
            await env.aclose()

    groups = asyncio.run(go())
    asyncio.run(policy.inner.aclose())
    assert len(groups) == 1 and stats.failed_attempts == 2 and stats.retried_rollouts == 2
    # One rollout lost (twice), one collected again: the summary's two resilience counts agree.
    assert stats.lost_to_env_workers == 1 and stats.collected_again == 1


def test_max_context_and_max_turns_end_cleanly_with_truncated(env_url, tiny):
    model, tok = tiny
    policy = RecordingPolicy(model, tok)

    async def go(env):
        task = Task(task_id="signal-train-0003", env_type="signal")
        # The prompt alone is ~50 tokens: a 60-token context leaves room for the first turn only.
        short = await run_episode(task, env, policy.generate, tok, config(max_context=60, max_new_tokens=8),
                                  seed=1, sampling=Sampling(max_tokens=8, temperature=1.0))
        one_turn = await run_episode(task, env, policy.generate, tok, config(max_turns=1), seed=1)
        return short, one_turn

    short, one_turn = asyncio.run(_with_env(env_url, go))
    asyncio.run(policy.inner.aclose())
    assert short.trajectory.truncated and len(short.trajectory.steps) < 2
    assert len(short.trajectory.prompt_ids) + len(short.trajectory.response_ids) <= 60 + 20  # + closing glue
    assert one_turn.trajectory.truncated and len(one_turn.trajectory.steps) == 1
    assert one_turn.trajectory.outcome == 0.0  # evaluated: the question was never answered


def test_updater_runs_minibatches_and_moves_the_policy(tiny):
    model, tok = tiny
    import copy

    trainable = copy.deepcopy(model)
    updater = PolicyUpdater(trainable, OptimConfig(lr=1e-2, epochs=2, minibatches=2, micro_batch_size=1),
                            PolicyLossConfig(entropy_coef=0.01), pad_id=0, total_updates=1)
    prompt = tok.encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    left, right = tok.encode("left", add_special_tokens=False), tok.encode("right", add_special_tokens=False)
    samples = [TrainSample(prompt, left, [1] * len(left), [1.0] * len(left)),
               TrainSample(prompt, right, [1] * len(right), [-1.0] * len(right), experience_flag=True)] * 2
    with torch.no_grad():
        before = response_logprobs(trainable, collate(samples[:1], 0, torch.device("cpu")))[0][0, 0]
    metrics = updater.update(samples)
    with torch.no_grad():
        after = response_logprobs(trainable, collate(samples[:1], 0, torch.device("cpu")))[0][0, 0]
    assert metrics["update/optimizer_steps"] == 4.0  # 2 epochs x 2 minibatches
    assert "update/clip_frac_flagged" in metrics and "update/entropy" in metrics
    assert after > before  # the positive-advantage answer became more likely



def test_the_kl_term_is_taken_on_the_experience_stripped_context(env_url, tiny):
    """Real episodes with injected experience; the update's KL to a frozen reference (`loss.kl_coef`, k3) equals
    the one computed by hand from both models on the stripped training tokens, not the one on the context the
    policy generated from (which held the experience)."""
    import copy

    from trainer.loss import low_var_kl

    model, tok = tiny
    policy = RecordingPolicy(model, tok)

    async def go(env):
        tasks = [Task(task_id="signal-train-0001", env_type="signal")]
        return await collect_groups(tasks, env, policy.generate, tok, config(n=2, max_turns=1, experience_ratio=1.0),
                                    experience=FixedExperience("Remember the last word you are shown."), seed=4)

    rollouts = [r for g in asyncio.run(_with_env(env_url, go)) for r in g]
    asyncio.run(policy.inner.aclose())
    exp_ids = tok.encode(EXP_OPEN, add_special_tokens=False)
    assert len(rollouts) == 2 and all(r.trajectory.experience_flag for r in rollouts)
    assert len(policy.contexts) == 2 and all(_contains(c, exp_ids) for c in policy.contexts)
    samples = [TrainSample(seg.prompt_ids, seg.response_ids, seg.loss_mask, [1.0] * len(seg.response_ids),
                           experience_flag=True) for r in rollouts for seg in r.segments]
    assert not any(_contains(s.prompt_ids + s.response_ids, exp_ids) for s in samples)
    reference = copy.deepcopy(model)  # frozen, and moved off the policy so that the KL is not 0
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=noise) * 0.05)
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(lr=1e-3, minibatches=1, micro_batch_size=8),
                            PolicyLossConfig(kl_coef=0.1), pad_id=0, total_updates=1, ref_model=reference)
    # The reference log-probs the update takes (its own scoring call), then the update and its reported KL
    # (one micro-batch: the token mean over both samples).
    used = updater.score(updater.ref_model, samples)
    reported = updater.update(samples)["update/kl"]

    def by_hand(rows):
        """Per mask-1 token of (context, response, mask) rows: the policy's and the reference's log-probs."""
        logps, ref_logps = [], []
        for context, response, mask in rows:
            batch = collate([TrainSample(context, response, mask, [0.0] * len(response))], 0, torch.device("cpu"))
            keep = torch.tensor(mask, dtype=torch.bool)
            with torch.no_grad():
                logps.append(response_logprobs(model, batch)[0][0][keep])
                ref_logps.append(response_logprobs(reference, batch)[0][0][keep])
        return torch.cat(logps), torch.cat(ref_logps)

    logp, ref_logp = by_hand([(s.prompt_ids, s.response_ids, s.loss_mask) for s in samples])
    seen_logp, seen_ref_logp = by_hand([(c, o, [1] * len(o))
                                        for c, o in zip(policy.contexts, policy.outputs, strict=True)])
    used_tokens = torch.cat([used[i][torch.tensor(s.loss_mask, dtype=torch.bool)] for i, s in enumerate(samples)])
    assert torch.allclose(used_tokens, ref_logp, atol=1e-5)
    assert (seen_ref_logp - ref_logp).abs().max() > 1e-3  # the experience in the context moves them
    assert reported == pytest.approx(float(low_var_kl(logp, ref_logp).mean()), rel=1e-4)
    assert reported != pytest.approx(float(low_var_kl(seen_logp, seen_ref_logp).mean()), rel=1e-4)


# ---------------------------------------------------------------- inject: turns (issue 14)

DEMO_ANSWER = "zebra quartz demonstration"


def test_turns_mode_shows_a_retrieved_demonstration_to_generation_only(env_url, tiny, tmp_path):
    """A real experience manager over HTTP keeps a solved trajectory as a demonstration; in `turns` mode
    the flagged rollouts generate after it, their training samples never contain it, and a pool whose
    hits have no demonstration falls back to text (counted)."""
    from common.schemas import Trajectory
    from experience_manager.client import ExperienceClient
    from tests.helpers import run_service
    from trainer.peers import ExperiencePeer
    from trainer.records import rollout_record

    model, tok = tiny
    own, other = "goal:echo(text):names", "goal:shout(text):ids"  # the task's kind and another
    task = Task(task_id="signal-train-0000", env_type="signal", metadata={"task_kind": own})

    async def seed(em_url, env):
        created = await env.create("signal", task)
        await env.release(created.instance_id)
        query = next(m.text() for m in created.messages if m.role == "user")
        solved = [{"role": "user", "content": f"{query} Please."}, {"role": "assistant", "content": DEMO_ANSWER}]
        # Another kind's demonstration of the very query ranks higher on text alone: the task's kind decides.
        closer = [{"role": "user", "content": query}, {"role": "assistant", "content": "another kind"}]
        async with ExperienceClient(em_url) as client:
            for ws, outcome in (("demos", 1.0), ("no_demos", 0.0)):
                await client.summarize(ws, [Trajectory(task_id="signal-train-0009", messages=solved, outcome=outcome,
                                                       metadata={"task_kind": own})], mode="heuristic")
            await client.summarize("demos", [Trajectory(task_id="signal-train-0008", messages=closer, outcome=1.0,
                                                        metadata={"task_kind": other})], mode="heuristic")

    async def collect(em_url, env, workspace, policy, stats):
        peer = ExperiencePeer(em_url, workspace)
        try:
            return await collect_groups([task], env, policy.generate, tok, config(n=2, experience_ratio=0.5),
                                        experience=peer, stats=stats, seed=3, inject="turns")
        finally:
            await peer.aclose()

    demo_ids = tok.encode(DEMO_ANSWER, add_special_tokens=False)
    with run_service("experience_manager", ["--store", str(tmp_path / "store")]) as em:
        asyncio.run(_with_env(env_url, lambda env: seed(em.url, env)))
        policy, stats = RecordingPolicy(model, tok), GroupStats()
        groups = asyncio.run(_with_env(env_url, lambda env: collect(em.url, env, "demos", policy, stats)))
        asyncio.run(policy.inner.aclose())
        plain_policy, plain_stats = RecordingPolicy(model, tok), GroupStats()
        fallback = asyncio.run(_with_env(env_url, lambda env: collect(em.url, env, "no_demos", plain_policy,
                                                                       plain_stats)))
        asyncio.run(plain_policy.inner.aclose())

    assert stats.turns_injected == 1 and stats.text_fallbacks == 0
    flagged = [r for r in groups[0] if r.trajectory.experience_flag]
    assert len(flagged) == 1
    turns = len(flagged[0].trajectory.steps)
    # Generation saw the demonstration (as an earlier assistant turn) on each of the flagged rollout's turns ...
    assert sum(_contains(c, demo_ids) for c in policy.contexts) == turns
    # ... the training samples never do, and their prompt is the plain one.
    plain_prompt = next(r for r in groups[0] if not r.trajectory.experience_flag).trajectory.prompt_ids
    for r in groups[0]:
        assert not _contains(r.trajectory.prompt_ids + r.trajectory.response_ids, demo_ids)
        assert r.trajectory.prompt_ids == plain_prompt
        assert len(r.trajectory.loss_mask) == len(r.trajectory.response_ids)
    # The generated ids are reused unchanged: the mask-1 tokens are exactly what the policy produced.
    generated = [t for t, m in zip(flagged[0].trajectory.response_ids, flagged[0].trajectory.loss_mask, strict=True) if m]
    demo_contexts = [i for i, c in enumerate(policy.contexts) if _contains(c, demo_ids)]
    assert generated == [t for i in demo_contexts for t in policy.outputs[i]]
    record = rollout_record(1, flagged[0], [0.0] * len(flagged[0].trajectory.response_ids), lambda ids: [])
    assert record["experience_demonstration"][-1] == {"role": "assistant", "content": DEMO_ANSWER}
    assert record["experience_text"] is None
    # The record names the demonstration shown (its experience, of the task's own kind) and the task's kind.
    assert record["demonstration"]["kind"] == own == record["task_kind"]
    assert record["demonstration"]["id"] in flagged[0].trajectory.experience_ids
    assert (stats.demos_kind_known, stats.demos_same_kind) == (1, 1)

    # A failed source keeps no demonstration: the flagged rollout gets the text, counted as a fallback.
    assert plain_stats.turns_injected == 0 and plain_stats.text_fallbacks == 1
    fell_back = next(r for r in fallback[0] if r.trajectory.experience_flag)
    assert fell_back.experience_text
    assert fell_back.experience_demonstration is None
    exp_ids = tok.encode(EXP_OPEN, add_special_tokens=False)
    assert sum(_contains(c, exp_ids) for c in plain_policy.contexts) == len(fell_back.trajectory.steps)


class FixedDemonstration:
    """Stands in for the experience manager's retrieval: one hit that carries a demonstration."""

    def __init__(self, demonstration):
        self.demonstration = demonstration

    async def retrieve(self, query):
        from trainer.peers import Retrieved

        return Retrieved("a case", ["exp-1"], self.demonstration)


CONTEXT = 640


def test_demonstrations_that_do_not_fit_are_shortened_or_dropped_and_counted(env_url, tiny):
    """A demonstration that would leave the episode too little context is shown with its observations cut
    (the calls whole); one that still does not fit is not shown, and that rollout is not flagged."""
    model, tok = tiny
    # The episode is expected to need two generations and a 300-token observation like the demonstration's:
    # the demonstration fits only cut (a short query), or not at all (a 300-token query).
    task = Task(task_id="signal-train-0000", env_type="signal")
    long_observation = " ".join(["door"] * 300)
    call = "zebra quartz call"
    shortenable = [{"role": "user", "content": "go"}, {"role": "assistant", "content": call},
                   {"role": "tool", "content": long_observation}, {"role": "assistant", "content": "done"}]
    too_long = [{"role": "user", "content": long_observation}, *shortenable[1:]]
    call_ids = tok.encode(call, add_special_tokens=False)
    door_ids = tok.encode(" door door door door door door", add_special_tokens=False)

    def collect(demonstration):
        policy, stats = RecordingPolicy(model, tok), GroupStats()
        groups = asyncio.run(_with_env(env_url, lambda env: collect_groups(
            [task], env, policy.generate, tok, config(n=2, experience_ratio=0.5, max_context=CONTEXT), seed=3,
            stats=stats,
            experience=FixedDemonstration(demonstration), inject="turns", demonstration_observation_tokens=4)))
        asyncio.run(policy.inner.aclose())
        return groups[0], policy, stats

    group, policy, stats = collect(shortenable)
    assert (stats.turns_injected, stats.demos_shortened, stats.demos_dropped) == (1, 1, 0)
    flagged = [r for r in group if r.trajectory.experience_flag]
    assert len(flagged) == 1 and flagged[0].trajectory.experience_ids == ["exp-1"]
    shown = [c for c in policy.contexts if _contains(c, call_ids)]
    assert len(shown) == len(flagged[0].trajectory.steps)  # every turn of the flagged rollout saw the call
    assert all(not _contains(c, door_ids) and len(c) <= CONTEXT for c in policy.contexts)

    group, policy, stats = collect(too_long)
    assert (stats.turns_injected, stats.demos_shortened, stats.demos_dropped) == (0, 0, 1)
    assert not any(r.trajectory.experience_flag or r.trajectory.experience_ids for r in group)
    assert not any(_contains(c, call_ids) for c in policy.contexts)
