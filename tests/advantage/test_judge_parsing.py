"""Prompt rendering, output parsing and label reconciliation of the judge (no network)."""

from __future__ import annotations

import json

from advantage.judge.core import parse_output
from advantage.judge.parsing import complete_labels, parse_judgments, reconcile
from advantage.judge.prompt import SYSTEM_PROMPT, TEXT_FORMAT, build_messages, truncate
from advantage.judge.schemas import JudgeStep, JudgeTrajectory
from advantage.judge.structured import analysis_chars, label_schema, parse_json_judgments


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
    assert system["content"] == SYSTEM_PROMPT.format(output_format=TEXT_FORMAT)
    assert "GOOD only if the step actively fixed an error" in SYSTEM_PROMPT
    assert "Unused or later-discarded outputs generally indicate BAD" in SYSTEM_PROMPT
    assert "Step i Judgment: GOOD or BAD" in system["content"]
    content = user["content"]
    assert ">>> EVAL-STEP 0 <<<" in content and ">>> EVAL-STEP 1 <<<" in content
    assert "THE END" in content and "characters cut" in content  # head and tail kept
    assert len(content) < 1200
    assert "OUTCOME: SUCCESS" in content and "Reminder (SUCCESS)" in content
    failed = build_messages(traj.model_copy(update={"outcome": 0.5}), max_step_chars=300, max_query_chars=100,
                            success_threshold=0.5)
    assert "OUTCOME: FAILURE" in failed[1]["content"]
    # AgentEvolver's reminder for a negative score: diagnosis, fix, quoted evidence, else BAD.
    assert "DIAGNOSIS, a FIX and quoted EVIDENCE" in failed[1]["content"]
    assert "if the evidence is missing, it is BAD" in failed[1]["content"]
    structured = build_messages(traj, max_step_chars=300, max_query_chars=100, success_threshold=0.5,
                                structured_max_tokens=200)
    assert '"step_0" to "step_1"' in structured[0]["content"] and "Step i Judgment" not in structured[0]["content"]
    assert len(truncate(long, 300)) == 300


def test_label_schema_names_every_step_and_fits_the_budget():
    schema = label_schema(3, 300)
    assert list(schema["properties"]) == schema["required"] == ["step_0", "step_1", "step_2"]
    step = schema["properties"]["step_1"]
    assert step["required"] == ["analysis", "judgment"]
    assert step["properties"]["judgment"]["enum"] == ["GOOD", "BAD"]
    # 300 tokens / 3 steps = 100, minus 24 overhead = 76 tokens * 3 chars, capped at 200
    assert step["properties"]["analysis"]["maxLength"] == 200 == analysis_chars(3, 300)
    # 40 steps in 1200 tokens: 30 - 24 = 6 tokens = 18 chars < 20, so judgments only
    assert analysis_chars(40, 1200) == 0
    assert label_schema(40, 1200)["properties"]["step_39"]["required"] == ["judgment"]
    assert analysis_chars(10, 700) == (70 - 24) * 3 == 138


def test_json_answer_whole_cut_off_and_text_fallback():
    whole = json.dumps({"step_0": {"analysis": "searched \"BOS\"", "judgment": "GOOD"},
                        "step_1": {"analysis": "x", "judgment": "BAD"}})
    parsed = parse_json_judgments(whole)
    assert parsed.labels == {0: "GOOD", 1: "BAD"} and parsed.reasons[0] == 'searched "BOS"'
    cut = whole[:whole.index('"step_1"') + 30]  # the token limit stopped the answer inside step 1
    assert parse_json_judgments(cut).labels == {0: "GOOD"}
    judgments_only = '{"step_0": {"judgment": "BAD"}, "step_1": {"judgment": "GOOD"'
    assert parse_json_judgments(judgments_only).labels == {0: "BAD", 1: "GOOD"}
    assert parse_output("Step 0 Judgment: BAD").labels == {0: "BAD"}
    assert parse_output('{"verdict": "fine"}').labels == {}
