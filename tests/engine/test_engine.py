"""The batching engine on the tiny model, in process: batching must not change what is generated."""

from __future__ import annotations

import concurrent.futures
import math
import re
import time
from collections.abc import Iterator

import pytest
import torch

from engine.generation import Engine, SamplingParams
from engine.models import load_model

TIMEOUT = 300  # seconds; generous for a loaded shared machine


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    model, tok = load_model("tiny")
    eng = Engine(model, tok, max_batch=8, batch_window_s=0.05)  # threads: leave the test process as it is
    yield eng
    eng.close()


def _wait_until_decoding(engine: Engine, future: concurrent.futures.Future) -> None:
    while engine.active_rows == 0 and not future.done():
        time.sleep(0.001)


def _prompts(engine: Engine) -> list[list[int]]:
    tok = engine.tokenizer
    texts = ["go left", "go right and then go up to the door", "take the key", "open the box with the red key now"]
    return [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                    return_dict=False) for t in texts]


def test_batched_generation_matches_one_at_a_time(engine: Engine) -> None:
    prompts = _prompts(engine)
    greedy = SamplingParams(max_tokens=6, temperature=0)
    alone = [engine.submit(p, greedy).result(timeout=TIMEOUT) for p in prompts]
    before = engine.stats.prefill_batches
    together = [f.result(timeout=TIMEOUT) for f in [engine.submit(p, greedy) for p in prompts]]
    assert engine.stats.prefill_batches - before < len(prompts)  # they shared a prefill
    for a, b in zip(alone, together, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in
                   zip(a.completions[0].token_logprobs, b.completions[0].token_logprobs, strict=True))


def test_rows_join_a_running_batch(engine: Engine) -> None:
    prompts = _prompts(engine)
    long_run = engine.submit(prompts[1], SamplingParams(max_tokens=60, temperature=0))
    # Wait until the first row is decoding, then add a second request: it joins the running batch.
    _wait_until_decoding(engine, long_run)
    joined = engine.submit(prompts[3], SamplingParams(max_tokens=5, temperature=0)).result(timeout=TIMEOUT)
    first = long_run.result(timeout=TIMEOUT)
    assert len(first.completions[0].token_ids) == 60 and len(joined.completions[0].token_ids) == 5
    reference = engine.submit(prompts[3], SamplingParams(max_tokens=5, temperature=0)).result(timeout=TIMEOUT)
    assert joined.completions[0].token_ids == reference.completions[0].token_ids
    assert engine.stats.max_rows_in_batch >= 2


def test_n_rows_seed_and_logprobs(engine: Engine) -> None:
    prompt = _prompts(engine)[0]
    params = SamplingParams(max_tokens=8, temperature=1.0, top_p=0.9, seed=7, n=3, top_logprobs=3)
    first = engine.submit(prompt, params).result(timeout=TIMEOUT)
    again = engine.submit(prompt, params).result(timeout=TIMEOUT)
    assert [c.token_ids for c in first.completions] == [c.token_ids for c in again.completions]
    assert len({tuple(c.token_ids) for c in first.completions}) > 1  # n samples differ from each other
    for completion in first.completions:
        assert len(completion.token_logprobs) == len(completion.token_ids) == len(completion.top_logprobs)
        assert all(math.isfinite(lp) and lp <= 0 for lp in completion.token_logprobs)
        assert all(len(alts) == 3 for alts in completion.top_logprobs)
    other_seed = engine.submit(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=8)).result(timeout=TIMEOUT)
    assert other_seed.completions[0].token_ids != first.completions[0].token_ids


def test_token_logprobs_are_log_softmax_of_raw_logits(engine: Engine) -> None:
    prompt = _prompts(engine)[2]
    result = engine.submit(prompt, SamplingParams(max_tokens=3, temperature=0.7, seed=1)).result(timeout=TIMEOUT)
    ids = torch.tensor([prompt + result.completions[0].token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(engine.model(ids).logits[0].float(), dim=-1)
    for i, token in enumerate(result.completions[0].token_ids):
        expected = float(logprobs[len(prompt) - 1 + i, token])
        assert math.isclose(result.completions[0].token_logprobs[i], expected, abs_tol=1e-4)


def test_stop_strings_cut_the_text(engine: Engine) -> None:
    prompt = _prompts(engine)[0]
    free = engine.submit(prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=3)).result(timeout=TIMEOUT)
    text = free.completions[0].text
    assert len(text) > 4, text
    stop = text[2:4]
    cut = engine.submit(prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=3, stop=(stop,))).result(timeout=TIMEOUT)
    completion = cut.completions[0]
    assert completion.finish_reason == "stop" and completion.text == text[:text.find(stop)]
    assert completion.token_ids == free.completions[0].token_ids[:len(completion.token_ids)]


def test_weight_update_waits_for_running_rows_and_bumps_version(engine: Engine) -> None:
    prompt = _prompts(engine)[0]
    greedy = SamplingParams(max_tokens=30, temperature=0)
    before = engine.submit(prompt, greedy).result(timeout=TIMEOUT)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    running = engine.submit(prompt, greedy)
    _wait_until_decoding(engine, running)
    changed = {k: v * 1.5 if k.endswith("norm.weight") else v for k, v in state.items()}
    engine.check_state_dict(changed)
    version = engine.update_weights(changed).result(timeout=TIMEOUT)
    # The running request finished on the old weights and says so.
    assert running.result(timeout=TIMEOUT).completions[0].token_ids == before.completions[0].token_ids
    assert running.result().policy_version == version - 1
    after = engine.submit(prompt, greedy).result(timeout=TIMEOUT)
    assert after.policy_version == version
    assert after.completions[0].token_logprobs != before.completions[0].token_logprobs
    engine.update_weights(state, version=0).result(timeout=TIMEOUT)  # restore for other tests
    assert engine.policy_version == 0


def test_check_state_dict_names_problems(engine: Engine) -> None:
    state = dict(engine.model.state_dict())
    bad = {k: v for k, v in state.items() if not k.endswith("layers.0.mlp.up_proj.weight")}
    bad["model.extra.weight"] = torch.zeros(1)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError) as info:
        engine.check_state_dict(bad)
    message = str(info.value)
    assert "model.extra.weight" in message and "layers.0.mlp.up_proj.weight" in message
    assert "model.norm.weight: got (3,)" in message
    # Tied weights: the lm_head alias of the embeddings may be left out.
    engine.check_state_dict({k: v for k, v in state.items() if k != "lm_head.weight"})


def test_prefill_groups_respect_the_token_budget() -> None:
    import concurrent.futures as cf

    from engine.generation import _Job, _prefill_groups

    jobs = [_Job([1] * n, SamplingParams(max_tokens=1), cf.Future()) for n in (50, 10, 30, 12, 200)]
    groups = _prefill_groups(jobs, budget=64)
    assert [[len(j.prompt_ids) for j in g] for g in groups] == [[10, 12], [30], [50], [200]]
    assert all(max(len(j.prompt_ids) for j in g) * len(g) <= 64 or len(g) == 1 for g in groups)
    assert sum(len(g) for g in groups) == len(jobs)


def test_engine_refuses_requests_that_would_break_a_batch(engine: Engine) -> None:
    prompt = _prompts(engine)[0]
    for ids, params, fragment in [
        ([], SamplingParams(max_tokens=1), "non-empty"),
        ([1, 10**6], SamplingParams(max_tokens=1), "ids in [0, 1024)"),
        (prompt, SamplingParams(max_tokens=1, n=9), "max batch 8"),
        (prompt, SamplingParams(max_tokens=5000), "context of 2048"),
    ]:
        with pytest.raises(ValueError, match=re.escape(fragment)):
            engine.submit(ids, params).result(timeout=TIMEOUT)
    assert engine.submit(prompt, SamplingParams(max_tokens=2)).result(timeout=TIMEOUT).completions


def test_identical_prompts_are_prefilled_once(engine: Engine) -> None:
    prompt = _prompts(engine)[1]
    greedy = SamplingParams(max_tokens=5, temperature=0)
    alone = engine.submit(prompt, greedy).result(timeout=TIMEOUT)
    before = (engine.stats.prefill_batches, engine.stats.prefill_tokens, engine.stats.shared_prefill_rows)
    jobs = [engine.submit(prompt, greedy) for _ in range(3)] + [engine.submit(prompt, SamplingParams(
        max_tokens=5, temperature=0, n=2))]
    results = [f.result(timeout=TIMEOUT) for f in jobs]
    batches = engine.stats.prefill_batches - before[0]
    assert batches < 4  # requests that arrive together share a forward
    assert engine.stats.prefill_tokens - before[1] == batches * len(prompt)  # ...and the prompt is computed once
    assert engine.stats.shared_prefill_rows - before[2] == 5 - batches
    for completion in [c for r in results for c in r.completions]:
        assert completion.token_ids == alone.completions[0].token_ids
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in
                   zip(completion.token_logprobs, alone.completions[0].token_logprobs, strict=True))


def test_ignore_eos_runs_to_max_tokens(engine: Engine) -> None:
    prompt = _prompts(engine)[0]
    eos = engine.eos_ids[0]
    # Stop on a token the tiny model emits first, then ask the same row with that token as EOS ignored.
    first = engine.submit(prompt, SamplingParams(max_tokens=1, temperature=0)).result(timeout=TIMEOUT)
    token = first.completions[0].token_ids[0]
    stopped = engine.submit(prompt, SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(token,)))
    assert stopped.result(timeout=TIMEOUT).completions[0].token_ids == [token]
    forced = engine.submit(prompt, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)).result(timeout=TIMEOUT)
    assert len(forced.completions[0].token_ids) == 6 and eos in engine.eos_ids


def test_rows_survive_the_cache_shrinking_under_them(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = _prompts(engine) * 2  # 8 rows: 6 finish after 2 tokens, then the cache shrinks to 4 slots
    lengths = [2, 2, 2, 20, 2, 2, 2, 20]
    alone = [engine.submit(p, SamplingParams(max_tokens=n, temperature=0)).result(timeout=TIMEOUT)
             for p, n in zip(prompts, lengths, strict=True)]
    before = engine.stats.kv_reallocations
    # Every size the cache takes, recorded where it changes: a thread polling `capacity` can miss a short-lived one.
    slots_seen = []
    resize = engine._cache._resize
    monkeypatch.setattr(engine._cache, "_resize", lambda rows, columns: (resize(rows, columns), slots_seen.append(rows)))
    futures = [engine.submit(p, SamplingParams(max_tokens=n, temperature=0)) for p, n in zip(prompts, lengths,
                                                                                              strict=True)]
    together = [f.result(timeout=TIMEOUT) for f in futures]
    time.sleep(0.05)  # the counters are copied after the step that resolved the futures
    assert 8 in slots_seen and 4 in slots_seen  # grown for the batch, shrunk when 6 rows left
    assert engine.stats.kv_reallocations - before >= 2
    for a, b in zip(alone, together, strict=True):
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.completions[0].token_logprobs, b.completions[0].token_logprobs,
                                              strict=True)) <= 1e-5
    assert engine.stats.kv_peak_bytes > 0


def test_distinct_prompts_compute_their_shared_prefix_once(engine: Engine) -> None:
    tok = engine.tokenizer
    system = tok.encode("You are a careful agent. Read the tools, plan each step, call one tool per turn, "
                        "and report the final answer in one short sentence. " * 2)
    assert len(system) > 40
    prompts = [system + tok.encode(t) for t in ("go left", "open the red box now", "take the key", "go")]
    greedy = SamplingParams(max_tokens=5, temperature=0)
    alone = [engine.submit(p, greedy).result(timeout=TIMEOUT) for p in prompts]
    before = (engine.stats.shared_prefix_tokens, engine.stats.prefill_tokens)
    futures = [engine.submit(p, greedy) for p in prompts]
    together = [f.result(timeout=TIMEOUT) for f in futures]
    saved = engine.stats.shared_prefix_tokens - before[0]
    computed = engine.stats.prefill_tokens - before[1]
    assert saved >= (len(prompts) - 1) * len(system) - 3 * 8  # nearly the whole prefix, once per extra prompt
    assert computed + saved == sum(len(p) for p in prompts)
    for a, b in zip(alone, together, strict=True):
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.completions[0].token_logprobs, b.completions[0].token_logprobs,
                                              strict=True)) <= 1e-4


def test_shared_prefix_clusters() -> None:
    from engine.generation import _shared_prefixes

    a = tuple(range(40))
    prompts = [a + (1, 2), (7,) * 50, a + (3,), a[:35] + (9, 9), (7,) * 20 + (1,), (5, 5)]
    clusters = {tuple(sorted(members)): shared for members, shared in _shared_prefixes(prompts, 32)}
    # 0, 1... share 35 tokens with prompt 3; the sevens share 20 (< 32): not a cluster; (5, 5) alone.
    assert clusters == {(0, 2, 3): 35, (1,): 0, (4,): 0, (5,): 0}
    # A prompt that is all prefix keeps its last token to compute (its logits).
    assert _shared_prefixes([a, a + (1,)], 32) == [([0, 1], 39)]


def test_decode_steps_count_the_columns_their_attention_reads(engine: Engine) -> None:
    from engine.kv_slots import _BLOCK

    short, long = _prompts(engine)[0], _prompts(engine)[3]
    assert len(short) < len(long)
    before = (engine.stats.decode_steps, engine.stats.attended_columns, engine.stats.real_columns)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    futures = [engine.submit(p, params) for p in (short, long)]
    for future in futures:
        future.result(timeout=TIMEOUT)
    steps = engine.stats.decode_steps - before[0]
    assert steps == 3  # one prefill for both (they joined together), then 3 steps of both rows
    # Step t: each row holds its prompt and t fed tokens, and attends to those and the token fed now; both
    # rows read the whole allocated span, the longer row's length rounded up to the cache's block.
    real = sum(len(p) + t + 1 for p in (short, long) for t in range(steps))
    attended = sum(2 * -(-(len(long) + t + 1) // _BLOCK) * _BLOCK for t in range(steps))
    assert engine.stats.real_columns - before[2] == real
    assert engine.stats.attended_columns - before[1] == attended
