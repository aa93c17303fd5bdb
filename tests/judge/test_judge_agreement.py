"""Agreement metrics against hand-computed values, and the committed ground-truth fixture itself."""

from __future__ import annotations

import pytest

from judge.agreement import (
    DEFAULT_FIXTURE,
    balanced_accuracy,
    baselines,
    bootstrap_ci,
    cohen_kappa,
    fixture_summary,
    load_fixture,
    recall,
    report,
)

G, B = "GOOD", "BAD"


def test_metrics_by_hand():
    truth = [G, G, G, B, B]
    pred = [G, G, B, B, G]
    # recall GOOD 2/3, recall BAD 1/2 -> balanced accuracy (2/3 + 1/2) / 2 = 7/12
    assert recall(truth, pred, G) == pytest.approx(2 / 3)
    assert balanced_accuracy(truth, pred) == pytest.approx(7 / 12)
    # observed 3/5; expected (3/5)(3/5) + (2/5)(2/5) = 13/25; kappa = (15/25 - 13/25) / (12/25) = 1/6
    assert cohen_kappa(truth, pred) == pytest.approx(1 / 6)
    assert cohen_kappa(truth, truth) == pytest.approx(1.0)
    assert cohen_kappa(truth, [G] * 5) == 0.0
    # inverted labels: both recalls 0
    flipped = [B if t == G else G for t in truth]
    assert balanced_accuracy(truth, flipped) == 0.0 and cohen_kappa(truth, flipped) < 0


def test_bootstrap_resamples_whole_groups():
    perfect = [([G, B], [G, B]), ([B], [B])]
    assert bootstrap_ci(perfect, balanced_accuracy, samples=200) == (1.0, 1.0)
    mixed = [([G, B], [G, B]), ([G, B], [B, G])]  # one task right, one inverted
    low, high = bootstrap_ci(mixed, balanced_accuracy, samples=400, seed=1)
    assert low == 0.0 and high == 1.0  # resamples with only the inverted, or only the right, task occur


def test_fixture_is_versioned_split_by_task_and_has_both_outcomes():
    rows = load_fixture(DEFAULT_FIXTURE, split=None)
    total = fixture_summary(rows)
    assert total["steps"] >= 200 and total["good"] > 0 and total["bad"] > 0
    assert 0 < total["successes"] < total["trajectories"]
    halves = {split: {(r.env, r.task_id) for r in rows if r.split == split} for split in ("dev", "test")}
    assert halves["dev"] and halves["test"] and not halves["dev"] & halves["test"]
    assert {r.env for r in rows} == {"flights", "bfcl"}
    assert {"reference", "wrong_argument", "wrong_tool", "redundant_call", "premature_finish",
            "rollout"} <= {r.source for r in rows}
    for r in rows:
        if r.source == "reference":
            assert set(r.labels) == {G} and r.outcome == 1.0
        if r.source in ("wrong_argument", "premature_finish"):
            assert r.labels[-1] == B and r.outcome == 0.0


def test_always_good_scores_one_half_on_the_test_half():
    test = load_fixture(DEFAULT_FIXTURE, split="test")
    assert {lab for t in test for lab in t.labels} == {G, B}
    labels = baselines(test)
    always = report(test, labels["always_good"], samples=200)
    assert always["balanced_accuracy"] == 0.5 and always["kappa"] == 0.0
    assert always["recall_good"] == 1.0 and always["recall_bad"] == 0.0
    truth = {t.trajectory_id: list(t.labels) for t in test}
    perfect = report(test, truth, samples=200)
    assert perfect["balanced_accuracy"] == 1.0 and perfect["kappa_ci95"] == [1.0, 1.0]
