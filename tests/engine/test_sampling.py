"""Batched inverse-CDF sampling (`engine.sampling`): hand-computed distributions, greedy and top-p rows."""

from __future__ import annotations

import math

import torch

from engine.sampling import sample_rows


def _gens(count: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(count)]


def test_frequencies_follow_the_softmax_and_forbidden_tokens_never_come() -> None:
    # Row 0: probs 0.5, 0.25, 0.25, 0 (log-odds by hand); row 1 at temperature 2: logits 0, ln 9 -> 1/4, 3/4.
    logits = torch.tensor([[math.log(2.0), 0.0, 0.0, float("-inf")],
                           [0.0, math.log(9.0), float("-inf"), float("-inf")]])
    gens = _gens(2)
    draws = 4000
    counts = torch.zeros(2, 4)
    for _ in range(draws):
        tokens = sample_rows(logits, [1.0, 2.0], [1.0, 1.0], gens)
        counts[0, tokens[0]] += 1
        counts[1, tokens[1]] += 1
    freq = counts / draws
    # 4 standard errors at p=0.5 and n=4000 is 0.032.
    assert torch.allclose(freq[0, :3], torch.tensor([0.5, 0.25, 0.25]), atol=0.03), freq
    assert torch.allclose(freq[1, :2], torch.tensor([0.25, 0.75]), atol=0.03), freq
    assert counts[0, 3] == 0 and counts[1, 2:].sum() == 0


def test_greedy_rows_take_the_argmax_and_sampled_rows_use_only_their_generator() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    first = sample_rows(logits, [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], _gens(3, seed=7))
    again = sample_rows(logits, [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], _gens(3, seed=7))
    assert first[0] == 1 and first[2] == 0
    assert first == again  # a row's seed fixes its token


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    # probs 0.5, 0.3, 0.2: top_p 0.5 keeps only token 0; top_p 0.7 keeps tokens 0 and 1 (0.5 < 0.7), never 2.
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.2, 0.5, 0.3]]))
    gens = _gens(2)
    seen: list[set[int]] = [set(), set()]
    for _ in range(400):
        tokens = sample_rows(logits, [1.0, 1.0], [0.5, 0.7], gens)
        seen[0].add(tokens[0])
        seen[1].add(tokens[1])
    assert seen == [{1}, {1, 2}]


def test_the_block_search_finds_tokens_in_any_block_of_a_large_vocabulary() -> None:
    # Vocabulary 1000 (4 blocks of 256, the last one padded): mass 0.5 on token 5, 0.25 on 300 and on 999.
    logits = torch.full((1, 1000), float("-inf"))
    logits[0, [5, 300, 999]] = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    gens = _gens(1)
    counts: dict[int, int] = {}
    for _ in range(2000):
        token = sample_rows(logits, [1.0], [1.0], gens)[0]
        counts[token] = counts.get(token, 0) + 1
    assert set(counts) == {5, 300, 999}
    # 4 standard errors at p=0.5 and n=2000 is 0.045.
    assert abs(counts[5] / 2000 - 0.5) < 0.045 and abs(counts[999] / 2000 - 0.25) < 0.045, counts
