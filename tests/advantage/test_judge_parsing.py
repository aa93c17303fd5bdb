"""Prompt rendering, output parsing and label reconciliation of the judge (no network)."""

from __future__ import annotations

from advantage.judge.parsing import complete_labels, parse_judgments, reconcile
from advantage.judge.prompt import SYSTEM_PROMPT, build_messages, truncate
from advantage.judge.schemas import JudgeStep, JudgeTrajectory


def test_parse_tolerates_markdown_and_case_but_not_template_echo():
    text = """Step 0 Analysis: it searched.
Step 0 Judgment: GOOD
**Step 1 Judgment:** bad
Step 2 judgement - Good
Step 3 Judgment: GOOD/BAD
Step 4 Judgment: GOOD or BAD
Step 0 Judgment: BAD"""
    parsed = parse_judgments(text)
    assert parsed.labels == {0: "GOOD", 1: "BAD", 2: "GOOD"}
    assert parsed.reasons == {0: "it searched."}
    assert parsed.duplicates == [0]


def test_reconcile_one_based_extra_and_fill():
    one_based = reconcile(parse_judgments("Step 1 Judgment: GOOD\nStep 2 Judgment: BAD\nStep 3 Judgment: BAD"), 3)
    assert one_based.labels == {0: "GOOD", 1: "BAD", 2: "BAD"}
    assert "numbered from 1" in one_based.notes[0]

    extra = reconcile(parse_judgments("Step 0 Judgment: GOOD\nStep 5 Judgment: BAD"), 3)
    assert extra.labels == {0: "GOOD"} and "beyond the last step 2" in extra.notes[0]
    labels, filled, notes = complete_labels(extra, 3, success=False)
    assert [lab.label for lab in labels] == ["GOOD", "BAD", "BAD"]
    assert filled == [1, 2]
    assert "filled with BAD (the outcome's sign: failure)" in notes[-1]
    assert labels[1].reason.startswith("filled")


def test_prompt_follows_the_rules_and_truncates_each_step():
    long = "x" * 5000 + "THE END"
    traj = JudgeTrajectory(trajectory_id="t", query="Book a flight", outcome=1.0,
                           steps=[JudgeStep(action="search_flight()", observation=long), JudgeStep(action="book")])
    system, user = build_messages(traj, max_step_chars=300, max_query_chars=100, success_threshold=0.5)
    assert system["content"] == SYSTEM_PROMPT
    assert "GOOD only if the step actively fixed an error" in SYSTEM_PROMPT
    assert "Step i Judgment: GOOD or BAD" in SYSTEM_PROMPT
    content = user["content"]
    assert ">>> EVAL-STEP 0 <<<" in content and ">>> EVAL-STEP 1 <<<" in content
    assert "THE END" in content and "characters cut" in content  # head and tail kept
    assert len(content) < 1200
    assert "OUTCOME: SUCCESS" in content
    failed = build_messages(traj.model_copy(update={"outcome": 0.5}), max_step_chars=300, max_query_chars=100,
                            success_threshold=0.5)
    assert "OUTCOME: FAILURE" in failed[1]["content"]
    assert len(truncate(long, 300)) == 300
