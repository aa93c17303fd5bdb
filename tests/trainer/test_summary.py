"""The end-of-run summary's before/after table: per-task values, paired changes, 95% intervals."""

from __future__ import annotations

import math

import pytest

from trainer.rollout import EvalSummary
from trainer.summary import eval_table, interval


def test_interval_is_the_normal_approximation_clipped_to_the_range():
    got = interval([0.0, 1.0, 1.0, 0.0])
    half = 1.959964 * math.sqrt(1 / 3) / 2  # sample sd of [0, 1, 1, 0] is sqrt(1/3)
    assert got["mean"] == 0.5 and got["lo"] == pytest.approx(0.5 - half) and got["hi"] == pytest.approx(0.5 + half)
    clipped = interval([0.0, 0.0, 0.0, 1.0], (0.0, 1.0))
    assert clipped["lo"] == 0.0 and clipped["hi"] < 1.0
    assert interval([0.3]) == {"mean": 0.3, "lo": 0.3, "hi": 0.3, "n": 1}


def test_table_pairs_tasks_and_reads_k_samples():
    before = EvalSummary(0.25, 0.5, 0.5, 2, 2, per_task={"a": [1.0, 0.0], "b": [0.0, 0.0]},
                         per_task_invalid={"a": 0.5, "b": 0.5})
    after = EvalSummary(0.75, 1.0, 0.0, 2, 2, per_task={"a": [1.0, 1.0], "b": [0.0, 1.0]},
                        per_task_invalid={"a": 0.0, "b": 0.0})
    table = eval_table(before, after)
    rows = {row["metric"]: row for row in table["rows"]}
    assert table["tasks"] == 2 and table["k"] == 2
    assert rows["avg@2"]["before"]["mean"] == 0.25 and rows["avg@2"]["after"]["mean"] == 0.75
    assert rows["avg@2"]["delta"]["mean"] == 0.5  # task a: 0.5 -> 1, task b: 0 -> 0.5
    assert rows["best@2"]["delta"]["mean"] == 0.5 and rows["best@2"]["delta"]["n"] == 2
    assert rows["invalid_action_rate"]["delta"]["mean"] == -0.5
    assert "delta" not in eval_table(None, after)["rows"][0]


def _group(*outcomes):
    from types import SimpleNamespace

    return [SimpleNamespace(trajectory=SimpleNamespace(outcome=o)) for o in outcomes]


def test_mixed_outcome_groups_counts_groups_whose_outcomes_differ():
    from trainer.summary import mixed_outcome_groups

    groups = [_group(0.0, 0.0, 0.0), _group(0.0, 1.0, 0.0), _group(None, 0.0), _group(0.5, 1.0), _group(1.0, 1.0)]
    assert mixed_outcome_groups(groups) == 2  # None reads as 0.0, so the third group is uniform


def test_training_signal_counts_steps_with_a_gradient_and_mixed_groups_once_per_step():
    from trainer.summary import training_signal

    records = [
        {"step": 0, "eval/avg@1": 0.0},  # the evaluation before training: not a step
        {"step": 1, "rollout/groups": 2.0, "rollout/mixed_outcome_groups": 0.0, "update/grad_norm": 0.0,
         "update/skipped": 1.0},  # every advantage 0: no update ran
        {"step": 2, "rollout/groups": 2.0, "rollout/mixed_outcome_groups": 2.0, "update/grad_norm": 0.5},
        {"step": 2, "rollout/groups": 2.0, "rollout/mixed_outcome_groups": 1.0, "update/grad_norm": 0.25},  # re-run
        {"step": 3, "rollout/groups": 4.0, "rollout/mixed_outcome_groups": 1.0},  # no update: no gradient
        {"step": 4, "rollout/groups": 2.0, "rollout/mixed_outcome_groups": 0.0, "update/grad_norm": 2.5e-7},  # noise
    ]
    got = training_signal(records)
    assert got["steps"] == 4 and got["steps_with_nonzero_grad"] == 1 and got["every_step_nonzero_grad"] is False
    assert got["grad_norm_per_step"] == [0.0, 0.25, 0.0, 2.5e-7] and got["skipped_updates"] == 1
    assert got["groups"] == 10 and got["mixed_outcome_groups"] == 2 and got["mixed_outcome_share"] == 0.2
    assert training_signal(records[2:3])["every_step_nonzero_grad"] is True
    assert training_signal([])["mixed_outcome_share"] is None and training_signal([])["every_step_nonzero_grad"] is False


def _checks(summary):
    from trainer.summary import loop_checks

    return {row["check"]: row for row in loop_checks(summary)}


def test_loop_checks_read_a_recorded_quickstart_summary():
    """The old quickstart's quiet run (6 steps, 8 validation tasks x 2): it moved the weights on judge labels
    alone, so the checks must say which of issue #14 point 7's bars it missed."""
    import json

    from tests.helpers import REPO

    recorded = json.loads((REPO / "benchmarks/results/quickstart-smollm2-quiet-final5-summary.json").read_text())
    checks = _checks(recorded)
    assert checks["held-out avg@2 change, paired"] == {
        "check": "held-out avg@2 change, paired", "value": "+0.000 [+0.000, +0.000] on 8 held-out tasks",
        "target": "95% CI above 0", "met": False}  # recorded before the summary named the split
    assert (checks["steps with a non-zero gradient"]["value"], checks["steps with a non-zero gradient"]["met"]) == (
        "6 of 6", True)
    assert (checks["groups with mixed outcomes"]["value"], checks["groups with mixed outcomes"]["met"]) == (
        "0 of 12 (0.00)", False)
    assert checks["judge parse rate"]["value"] == "0.941 (48 of 51 labels)" and checks["judge parse rate"]["met"] is False
    assert (checks["rollouts with injected experience"]["value"], checks["rollouts with injected experience"]["met"]) \
        == ("20", True)
    assert checks["experience hits (of retrievals)"]["value"] == "10 of 12"
    assert checks["synthetic tasks sampled (of tasks)"]["value"] == "6 of 12"


def _constructed_summary():
    before = EvalSummary(0.0, 0.0, 0.0, 3, 2, per_task={"a": [0.0, 0.0], "b": [0.0, 0.0], "c": [0.0, 0.0]},
                         per_task_invalid={})
    after = EvalSummary(0.5, 1.0, 0.0, 3, 2, per_task={"a": [1.0, 0.0], "b": [1.0, 0.0], "c": [1.0, 0.0]},
                        per_task_invalid={})
    return {
        "eval": eval_table(before, after, split="test"),
        "training": {"steps": 2, "steps_with_nonzero_grad": 2, "every_step_nonzero_grad": True, "groups": 4,
                     "mixed_outcome_groups": 3, "mixed_outcome_share": 0.75},
        "mechanisms": {"self_questioning": {"tasks_sampled": 4, "synthetic_sampled": 4},
                       "self_navigating": {"retrievals": 4, "hits": 3, "injected_rollouts": 8,
                                           "demonstrations_kind_known": 8, "demonstrations_same_kind": 7,
                                           "same_kind_share": 0.875},
                       "self_attributing": {"steps_labelled": 100, "parsed_labels": 99, "parse_rate": 0.99}},
    }


def test_loop_checks_meet_every_bar_of_a_run_that_learned_and_print_them(capsys, monkeypatch):
    from trainer.summary import print_summary

    monkeypatch.setenv("COLUMNS", "200")  # rich wraps cells at 80 columns when not on a terminal

    summary = _constructed_summary()
    checks = _checks(summary)
    # Every task went 0/2 -> 1/2: the paired differences are all +0.5, so the interval has zero width.
    assert checks["held-out avg@2 change, paired"]["value"] == "+0.500 [+0.500, +0.500] on 3 test tasks"
    assert all(row["met"] is True for row in checks.values()), checks
    assert checks["groups with mixed outcomes"]["value"] == "3 of 4 (0.75)"
    assert checks["judge parse rate"]["value"] == "0.990 (99 of 100 labels)"
    assert checks["demonstrations of the task's own kind"]["value"] == "0.875 (7 of 8)"

    summary["mechanisms"]["self_attributing"]["parse_rate"] = 0.98
    del summary["mechanisms"]["self_navigating"]
    checks = _checks(summary)
    assert checks["judge parse rate"]["met"] is False
    assert checks["rollouts with injected experience"] == {
        "check": "rollouts with injected experience", "value": "off", "target": "> 0", "met": None}

    print_summary(_constructed_summary())
    out = capsys.readouterr().out
    assert "test split, 3 tasks, k=2" in out
    for check in checks:
        assert check in out, check
    assert out.count("NO") == out.count("met: yes, NO"), "no check is printed as not met (the title names NO)"


def test_successes_with_a_tool_call_counts_successful_samples_only():
    from common.schemas import ChatMessage, Step
    from trainer.rollout import EvalSummary, made_tool_call
    from trainer.summary import eval_table

    def step(role: str, info: dict | None = None) -> Step:
        return Step(index=0, action=ChatMessage(role="assistant", content="x"),
                    observation=ChatMessage(role=role, content="{}"), info=info or {})

    assert made_tool_call([step("user"), step("tool")])
    assert not made_tool_call([step("tool", {"error": "parse_error"}), step("user")])  # an invalid call is none
    assert not made_tool_call([])
    # Successes: a's first (called) and third (did not); b's first (called) and second (did not).
    summary = EvalSummary(2 / 3, 1.0, 0.0, 2, 3, per_task={"a": [1.0, 0.0, 1.0], "b": [1.0, 1.0, 0.0]},
                          per_task_called={"a": [True, True, False], "b": [True, False, True]})
    assert summary.successes_with_tool_call() == 2 / 4
    assert summary.metrics()["eval/successes_with_tool_call"] == 0.5
    none = EvalSummary(0.0, 0.0, 0.0, 1, 3, per_task={"a": [0.0, 0.0, 0.0]}, per_task_called={"a": [True] * 3})
    assert none.successes_with_tool_call() is None and "eval/successes_with_tool_call" not in none.metrics()
    table = eval_table(none, summary)
    assert table["successes_with_tool_call"] == {"before": None, "after": 0.5}
    assert table["per_task"]["after"] == {"outcomes": summary.per_task, "called": summary.per_task_called,
                                           "prompts": summary.per_task_prompt}


def test_episodes_summarize_into_avg_best_and_invalid_rate_by_hand():
    from trainer.rollout import EpisodeResult, EvalSummary, summarize_episodes

    episodes = [EpisodeResult("a", 1.0, 2, 1, "answer 1", True, prompt="pa"),
                EpisodeResult("b", 0.5, 3, 0, "guess", False, prompt="pb", with_experience=True),
                EpisodeResult("a", 0.0, 1, 1, "answer 2", False, prompt="pa"),
                EpisodeResult("b", 1.0, 2, 0, "right", True, prompt="pb")]
    summary = summarize_episodes(episodes, k=2)
    # successes a: [1, 0], b: [0, 1] (0.5 is below the threshold): avg@2 (0.5 + 0.5) / 2, best@2 (1 + 1) / 2
    assert (summary.avg_at_k, summary.best_at_k, summary.tasks, summary.k) == (0.5, 1.0, 2, 2)
    assert summary.invalid_action_rate == 2 / 8
    assert summary.per_task == {"a": [1.0, 0.0], "b": [0.5, 1.0]}
    assert summary.per_task_invalid == {"a": 2 / 3, "b": 0.0}
    assert summary.per_task_answer == {"a": "answer 1", "b": "guess"}
    assert summary.per_task_prompt == {"a": "pa", "b": "pb"} and summary.experience_rollouts == 1
    assert summary.per_task_steps == {"a": [2, 1], "b": [3, 2]}
    assert summary.per_task_replies == {"a": ["answer 1", "answer 2"], "b": ["guess", "right"]}
    assert summary.per_task_called == {"a": [True, False], "b": [False, True]}
    assert summarize_episodes(episodes, k=2, success_threshold=0.5).avg_at_k == 0.75
    assert summarize_episodes([], k=2) == EvalSummary(0.0, 0.0, 0.0, 0, 2)


def _three_evaluations():
    """Three tasks, k = 2: before, right after the warm start, after RL (same tasks, same k)."""
    before = EvalSummary(1 / 6, 1 / 3, 0.5, 3, 2, per_task={"a": [0.0, 0.0], "b": [0.0, 0.0], "c": [1.0, 0.0]},
                         per_task_invalid={"a": 1.0, "b": 0.5, "c": 0.0})
    warm = EvalSummary(2 / 3, 1.0, 0.0, 3, 2, per_task={"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [1.0, 0.0]},
                       per_task_invalid={"a": 0.0, "b": 0.0, "c": 0.0})
    after = EvalSummary(5 / 6, 1.0, 0.0, 3, 2, per_task={"a": [1.0, 1.0], "b": [1.0, 0.0], "c": [1.0, 1.0]},
                        per_task_invalid={"a": 0.0, "b": 0.5, "c": 0.0})
    return before, warm, after


def test_a_warm_start_splits_the_change_into_the_warm_starts_and_rls_by_hand():
    before, warm, after = _three_evaluations()
    table = eval_table(before, after, split="test", warm_start=warm)
    avg = next(row for row in table["rows"] if row["metric"] == "avg@2")
    # avg@2 per task (a, b, c): before 0, 0, 0.5; after the warm start 0.5, 1, 0.5; after RL 1, 0.5, 1.
    assert [avg[name]["mean"] for name in ("before", "warm_start", "after")] == pytest.approx([1 / 6, 2 / 3, 5 / 6])
    # Paired differences and their sample sd: warm start 0.5, 1, 0 (sd 0.5); RL 0.5, -0.5, 0.5 (sd 1/sqrt(3));
    # total 1, 0.5, 0.5 (sd 1/sqrt(12)); the 95% half-width is 1.959964 sd / sqrt(3).
    half = {key: 1.959964 * sd / math.sqrt(3) for key, sd in
            (("delta_warm_start", 0.5), ("delta_rl", 1 / math.sqrt(3)), ("delta", 1 / math.sqrt(12)))}
    for key, mean, hi_clip in (("delta_warm_start", 0.5, 1.0), ("delta_rl", 1 / 6, None), ("delta", 2 / 3, None)):
        got = avg[key]
        assert got["n"] == 3 and got["mean"] == pytest.approx(mean), key
        assert got["lo"] == pytest.approx(mean - half[key]), key
        assert got["hi"] == pytest.approx(hi_clip if hi_clip is not None else mean + half[key]), key
    assert avg["delta"]["lo"] > 0 > avg["delta_rl"]["lo"]  # the total is a gain, RL's part alone is not
    invalid = next(row for row in table["rows"] if row["metric"] == "invalid_action_rate")
    assert (invalid["delta_warm_start"]["mean"], invalid["delta_rl"]["mean"], invalid["delta"]["mean"]) == \
        pytest.approx((-0.5, 1 / 6, -1 / 3))
    assert set(table["per_task"]) == set(table["successes_with_tool_call"]) == {"before", "warm_start", "after"}

    # Without the warm start's evaluation: today's two-column table, key for key.
    two = eval_table(before, after, split="test")
    assert two == eval_table(before, after, split="test", warm_start=None)
    assert {key for row in two["rows"] for key in row} == {"metric", "before", "after", "delta"}
    assert two["rows"][0]["delta"] == avg["delta"] and set(two["per_task"]) == {"before", "after"}


def test_the_loop_check_reads_the_total_change_and_reports_rls_part(capsys, monkeypatch):
    from trainer.summary import print_summary

    monkeypatch.setenv("COLUMNS", "200")
    before, warm, after = _three_evaluations()
    summary = {**_constructed_summary(), "eval": eval_table(before, after, split="test", warm_start=warm)}
    summary["mechanisms"]["self_attributing"]["labels_by_source"] = {"rule": 90, "llm": 10}
    check = _checks(summary)["held-out avg@2 change, paired"]
    assert check["met"] is True and check["value"] == (
        "+0.667 [+0.340, +0.993] on 3 test tasks (RL's part +0.167 [-0.487, +0.820])")
    print_summary(summary)
    out = capsys.readouterr().out
    for header in ("after the warm start", "after RL", "paired changes on the same tasks", "warm start", "total"):
        assert header in out, header
    assert "+0.500 [-0.066, +1.000]" in out  # the warm start's change
    assert "labels_by_source/llm" in out and "labels_by_source/rule" in out
