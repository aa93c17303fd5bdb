"""The update's speed levers keep its numbers: response-only logits, bucketing, reuse of rollout
log-probs (and when it is allowed), bf16 autocast, progress events; numerics against the generator."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from engine.models import load_model
from trainer.loss import PolicyLossConfig
from trainer.policy import InProcessPolicy, Sampling
from trainer.update import (
    OptimConfig,
    PolicyUpdater,
    TrainSample,
    UpdateProgress,
    collate,
    packed_logprobs,
    response_logprobs,
    shared_prompt_logprobs,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny")


def samples_for(tok) -> list[TrainSample]:
    """Rows of different prompt and response lengths, with mask-0 tokens inside the responses."""
    out = []
    for i, (prompt, answer) in enumerate([("go", "left"), ("go on then, please", "right and then left"),
                                          ("which way", "up"), ("tell me which way now", "down the road")]):
        p = tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        r = tok.encode(answer, add_special_tokens=False) + tok.encode("<|im_end|>\nok", add_special_tokens=False)
        n_answer = len(tok.encode(answer, add_special_tokens=False))
        mask = [1] * n_answer + [0] * (len(r) - n_answer)
        out.append(TrainSample(p, r, mask, [1.0 if i % 2 == 0 else -1.0] * len(r)))
    return out


def test_response_only_logits_equal_the_full_projection(tiny):
    model, tok = tiny
    batch = collate(samples_for(tok), 0, CPU)
    with torch.no_grad():
        full, full_ent = response_logprobs(model, batch, True, full_logits=True)
        resp, resp_ent = response_logprobs(model, batch, True)
    mask = batch.mask.bool()
    assert torch.allclose(full[mask], resp[mask], atol=1e-5)
    assert torch.allclose(full_ent[mask], resp_ent[mask], atol=1e-5)
    assert torch.all(resp[~mask] == 0)  # only trained positions are computed
    inside = torch.arange(mask.shape[1])[None, :] < torch.tensor(batch.lengths)[:, None]
    assert (inside & ~mask).any() and torch.all(full[inside & ~mask] < 0)  # full fills mask-0 tokens too


def gradient(model, samples, optim: OptimConfig) -> torch.Tensor:
    """The first minibatch gradient the updater takes, flattened (lr 0 keeps the weights)."""
    trainable = copy.deepcopy(model)
    updater = PolicyUpdater(trainable, optim.model_copy(update={"lr": 1e-30, "minibatches": 1, "grad_clip": 1e9}),
                            PolicyLossConfig(), pad_id=0, total_updates=1)
    taken: list[torch.Tensor] = []  # read at the optimizer step: the update frees the gradients after it
    updater.optimizer.register_step_pre_hook(lambda *_: taken.append(
        torch.cat([p.grad.flatten() for p in trainable.parameters() if p.grad is not None])))
    updater.update(samples)
    return taken[0]


def test_bucketing_and_response_logits_give_the_same_gradient(tiny):
    model, tok = tiny
    samples = samples_for(tok)
    base = gradient(model, samples, OptimConfig(logits="full", bucket_by_length=False, micro_batch_size=3))
    fast = gradient(model, samples, OptimConfig(logits="response", bucket_by_length=True, micro_batch_size=3))
    assert base.abs().max() > 0
    assert torch.allclose(base, fast, atol=1e-6, rtol=1e-4)


def grouped_samples(tok) -> list[TrainSample]:
    """Two prompts with three completions each (GRPO groups), interleaved, mask-0 tokens inside."""
    out = []
    for k in range(3):
        for g, prompt in enumerate(["go", "tell me which way now"]):
            answer = ["left", "right and then left", "up"][k] + " " * g
            p = tok.encode(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
            r = tok.encode(answer, add_special_tokens=False) + tok.encode("<|im_end|>\nok", add_special_tokens=False)
            mask = [1] * (len(r) - 2) + [0, 0]
            out.append(TrainSample(p, r, mask, [1.0 if (k + g) % 2 == 0 else -1.0] * len(r)))
    return out


def test_shared_prompt_logprobs_equal_the_padded_batch(tiny):
    model, tok = tiny
    group = grouped_samples(tok)[0::2]  # one prompt, three completions
    with torch.no_grad():
        padded, padded_ent = response_logprobs(model, collate(group, 0, CPU), True)
        shared, shared_ent = shared_prompt_logprobs(model, group, CPU, True)
    assert torch.allclose(padded, shared, atol=1e-5) and torch.allclose(padded_ent, shared_ent, atol=1e-5)
    assert (shared != 0).sum() == sum(sum(s.loss_mask) for s in group)


def test_shared_prompts_give_the_same_gradient_and_keep_groups_in_one_minibatch(tiny):
    model, tok = tiny
    samples = grouped_samples(tok)
    plain = gradient(model, samples, OptimConfig(share_prompts=False, micro_batch_size=4))
    shared = gradient(model, samples, OptimConfig(share_prompts=True, micro_batch_size=4))
    assert plain.abs().max() > 0
    assert torch.allclose(plain, shared, atol=1e-6, rtol=1e-4)
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(minibatches=2, micro_batch_size=2), PolicyLossConfig(),
                            pad_id=0, total_updates=1)
    parts = updater._minibatches(list(range(6)), samples)
    assert sorted(map(sorted, parts)) == [[0, 2, 4], [1, 3, 5]]  # the two prompt groups, whole
    # Each micro-batch holds one prompt's rows, at most micro_batch_size of them.
    assert list(updater._micro_batches([0, 1, 2, 3, 4], samples)) == [[0, 2], [4], [1, 3]]


@pytest.mark.parametrize("share", [True, False])
def test_packed_logprobs_equal_the_padded_batch(tiny, share):
    model, tok = tiny
    samples = grouped_samples(tok) + samples_for(tok)  # two groups of three, four prompts of one
    with torch.no_grad():
        padded, padded_ent = response_logprobs(model, collate(samples, 0, CPU), True)
        packed, packed_ent = packed_logprobs(model, samples, CPU, True, share_prompts=share)
    assert torch.allclose(padded, packed, atol=1e-5) and torch.allclose(padded_ent, packed_ent, atol=1e-5)
    assert (packed != 0).sum() == sum(sum(s.loss_mask) for s in samples)


def test_packing_gives_the_same_gradient_in_one_forward_per_micro_batch(tiny):
    model, tok = tiny
    samples = grouped_samples(tok) + samples_for(tok)
    plain = gradient(model, samples, OptimConfig(pack=False, share_prompts=False, micro_batch_size=4))
    packed = gradient(model, samples, OptimConfig(pack=True, micro_batch_size=4))
    assert plain.abs().max() > 0
    assert torch.allclose(plain, packed, atol=1e-6, rtol=1e-4)
    # One forward of a single row per micro-batch: 10 samples in micro-batches of at most 4 rows, whole prompt
    # groups apart (3 + 3), the four single rows together: 3 forwards of batch 1.
    shapes: list[tuple[int, ...]] = []
    trainable = copy.deepcopy(model)
    handle = trainable.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                 with_kwargs=True)
    updater = PolicyUpdater(trainable, OptimConfig(minibatches=1, micro_batch_size=4, fuse_old_logprobs=False),
                            PolicyLossConfig(), pad_id=0, total_updates=1)
    updater.update(samples)
    handle.remove()
    assert len(shapes) == 2 * 3 and all(shape[0] == 1 for shape in shapes)  # old log-probs, then the update
    # Each group's prompt once, then its responses: no padding.
    group = grouped_samples(tok)[0::2]
    assert shapes[0][1] <= len(group[0].prompt_ids) + sum(len(s.response_ids) for s in group)
    # A micro-batch whose packed sequence would pass pack_max_tokens runs padded instead.
    shapes.clear()
    capped = PolicyUpdater(trainable, OptimConfig(minibatches=1, micro_batch_size=4, share_prompts=False,
                                                  pack_max_tokens=8), PolicyLossConfig(), pad_id=0, total_updates=1)
    handle = trainable.register_forward_pre_hook(lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                 with_kwargs=True)
    capped.score(trainable, samples)
    handle.remove()
    assert [shape[0] for shape in shapes] == [4, 4, 2]


def test_fused_old_logprobs_skip_the_first_minibatch_forward_and_train_the_same(tiny):
    model, tok = tiny
    samples = grouped_samples(tok) + samples_for(tok)
    runs = {}
    for fuse in (False, True):
        trainable = copy.deepcopy(model)
        updater = PolicyUpdater(trainable, OptimConfig(lr=1e-2, epochs=2, minibatches=2, micro_batch_size=4,
                                                       fuse_old_logprobs=fuse), PolicyLossConfig(), pad_id=0,
                                total_updates=1, seed=3)
        scored: list[int] = []
        score = updater.score

        def counting(model_, samples_, indices=None, score=score, scored=scored):
            scored.extend(indices if indices is not None else range(len(samples_)))
            return score(model_, samples_, indices)

        updater.score = counting
        metrics = updater.update(samples)
        runs[fuse] = (torch.cat([p.detach().flatten() for p in trainable.parameters()]), sorted(scored), metrics)
    (plain_w, plain_scored, plain_m), (fused_w, fused_scored, fused_m) = runs[False], runs[True]
    assert plain_scored == list(range(10)) and plain_m["update/fused_old_logprob_frac"] == 0.0
    # The first minibatch (one of the two prompt groups + two single rows, or the like) is not scored apart.
    first = 10 - len(fused_scored)
    assert first > 0 and fused_m["update/fused_old_logprob_frac"] == first / 10
    assert abs(fused_m["update/ratio_mean"] - plain_m["update/ratio_mean"]) < 1e-4
    assert not torch.equal(plain_w, torch.cat([p.detach().flatten() for p in model.parameters()]))
    # Same weights after 4 Adam steps of lr 1e-2: within 1% of one step (float noise of the two forwards).
    assert float((plain_w - fused_w).abs().max()) <= 1e-4


def test_no_fused_old_logprobs_when_train_mode_has_dropout(tiny):
    model, tok = tiny
    dropping = copy.deepcopy(model)
    dropping.config.attention_dropout = 0.1
    updater = PolicyUpdater(dropping, OptimConfig(), PolicyLossConfig(), pad_id=0, total_updates=1)
    assert updater.update(grouped_samples(tok))["update/fused_old_logprob_frac"] == 0.0


def with_rollout(sample: TrainSample, logprobs: list[float], version: int | None, flagged: bool = False):
    return TrainSample(sample.prompt_ids, sample.response_ids, sample.loss_mask, sample.advantages, flagged,
                       rollout_logprobs=logprobs, policy_version=version)


def test_rollout_logprobs_are_reused_only_when_version_context_and_numerics_match(tiny):
    model, tok = tiny
    s = samples_for(tok)[0]
    zeros = [0.0] * len(s.response_ids)
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(), PolicyLossConfig(), pad_id=0, total_updates=1)
    assert updater.reusable(with_rollout(s, zeros, 3), policy_version=3)
    assert not updater.reusable(with_rollout(s, zeros, 2), policy_version=3)  # generated by an older policy
    assert not updater.reusable(with_rollout(s, zeros, None), policy_version=3)  # turns of mixed versions
    assert not updater.reusable(with_rollout(s, zeros, 3), policy_version=None)  # current version unknown
    assert not updater.reusable(with_rollout(s, zeros, 3, flagged=True), policy_version=3)  # experience stripped
    assert not updater.reusable(s, policy_version=0)  # the generator's numerics differ (endpoint): none given
    bf16 = PolicyUpdater(copy.deepcopy(model), OptimConfig(dtype="bfloat16"), PolicyLossConfig(), pad_id=0,
                         total_updates=1)
    assert not bf16.reusable(with_rollout(s, zeros, 3), policy_version=3)
    off = PolicyUpdater(copy.deepcopy(model), OptimConfig(reuse_rollout_logprobs=False), PolicyLossConfig(),
                        pad_id=0, total_updates=1)
    assert not off.reusable(with_rollout(s, zeros, 3), policy_version=3)


def test_reused_logprobs_are_the_old_logprobs_of_the_ratio(tiny):
    model, tok = tiny
    # Rollout log-probs of 0 (probability 1) as the old policy: the ratio becomes p < 1 when they are
    # used, and stays 1 when the updater recomputes them (lr ~0 keeps the policy where it is).
    samples = [with_rollout(s, [0.0] * len(s.response_ids), 5) for s in samples_for(tok)]
    optim = OptimConfig(lr=1e-30, minibatches=1)
    used = PolicyUpdater(copy.deepcopy(model), optim, PolicyLossConfig(), pad_id=0, total_updates=1)
    m_used = used.update(samples, policy_version=5)
    recomputed = PolicyUpdater(copy.deepcopy(model), optim, PolicyLossConfig(), pad_id=0, total_updates=1)
    m_recomputed = recomputed.update(samples, policy_version=6)
    assert m_used["update/reused_old_logprob_frac"] == 1.0 and m_recomputed["update/reused_old_logprob_frac"] == 0.0
    assert m_used["update/ratio_mean"] < 0.5
    assert abs(m_recomputed["update/ratio_mean"] - 1.0) < 1e-4


def test_one_progress_event_per_optimizer_step(tiny):
    model, tok = tiny
    samples = samples_for(tok)
    events: list[UpdateProgress] = []
    updater = PolicyUpdater(copy.deepcopy(model), OptimConfig(epochs=2, minibatches=2, micro_batch_size=1),
                            PolicyLossConfig(), pad_id=0, total_updates=1)
    metrics = updater.update(samples, progress=events.append)
    assert [e.minibatch for e in events] == [1, 2, 3, 4] and {e.total for e in events} == {4}
    assert sum(e.tokens for e in events) == 2 * sum(sum(s.loss_mask) for s in samples)
    assert metrics["update/optimizer_steps"] == 4.0


def test_bf16_autocast_trains_fp32_master_weights(tiny):
    model, tok = tiny
    trainable = copy.deepcopy(model)
    updater = PolicyUpdater(trainable, OptimConfig(lr=1e-2, epochs=2, dtype="bfloat16"), PolicyLossConfig(),
                            pad_id=0, total_updates=1)
    prompt = tok.encode("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    left = tok.encode("left", add_special_tokens=False)
    samples = [TrainSample(prompt, left, [1] * len(left), [1.0] * len(left))] * 4
    batch = collate(samples[:1], 0, CPU)
    with torch.no_grad():
        before = response_logprobs(trainable, batch)[0][0, 0]
    updater.update(samples)
    with torch.no_grad():
        after = response_logprobs(trainable, batch)[0][0, 0]
    assert all(p.dtype == torch.float32 for p in trainable.parameters())
    assert after > before


@pytest.fixture(scope="module")
def smollm2_rollouts():
    """SmolLM2 completions from the in-process engine (4 rows batched together), with their log-probs."""
    torch.set_num_threads(2)
    model, tok = load_model("smollm2")
    policy = InProcessPolicy(model, tok, max_batch=8)
    questions = ["Name a colour.", "What is two plus two? Answer briefly.", "Say hello to Ada.",
                 "Which way does the river point? One word: north, south, east, west."]

    async def go():
        prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False) for q in questions]
        ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
        outs = await asyncio.gather(*(policy.generate(p, Sampling(max_tokens=16, temperature=1.0, seed=i))
                                      for i, p in enumerate(ids)))
        await policy.aclose()
        return [TrainSample(p, o.token_ids, [1] * len(o.token_ids), [0.0] * len(o.token_ids),
                            rollout_logprobs=o.logprobs) for p, o in zip(ids, outs, strict=True)]

    return model, tok, asyncio.run(go())


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "max_bound", "mean_bound"), [("float32", 1e-3, 1e-3), ("bfloat16", None, 0.05)])
def test_update_logprobs_match_the_rollout(smollm2_rollouts, dtype, max_bound, mean_bound):
    model, tok, samples = smollm2_rollouts
    updater = PolicyUpdater(model, OptimConfig(dtype=dtype, micro_batch_size=4), PolicyLossConfig(),
                            pad_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                            total_updates=1)
    scored = updater.score(model, samples)
    delta = torch.cat([(scored[i] - torch.tensor(s.rollout_logprobs)).abs() for i, s in enumerate(samples)])
    assert delta.numel() >= 16
    assert float(delta.mean()) <= mean_bound
    if max_bound is not None:
        assert float(delta.max()) <= max_bound
