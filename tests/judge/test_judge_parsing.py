"""Prompt rendering, output parsing and label reconciliation of the judge (no network)."""

from __future__ import annotations

import json
import re

from judge.core import parse_output
from judge.parsing import complete_labels, parse_judgments, reconcile
from judge.prompt import SYSTEM_PROMPT, TEXT_FORMAT, build_messages, truncate
from judge.schemas import JudgeStep, JudgeTrajectory
from judge.structured import (
    analysis_chars,
    answer_tokens,
    label_schema,
    parse_json_judgments,
    worst_case_answer,
)


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
                                structured_analysis_chars=120)
    assert '"step_0" to "step_1"' in structured[0]["content"] and "Step i Judgment" not in structured[0]["content"]
    assert "at most 120 characters" in structured[1]["content"]
    assert len(truncate(long, 300)) == 300


def test_label_schema_names_every_step_and_allows_only_unescaped_analyses():
    schema = label_schema(3, 200)
    assert list(schema["properties"]) == schema["required"] == ["step_0", "step_1", "step_2"]
    step = schema["properties"]["step_1"]
    assert step["required"] == ["analysis", "judgment"]
    assert step["properties"]["judgment"]["enum"] == ["GOOD", "BAD"]
    analysis = step["properties"]["analysis"]
    assert analysis["maxLength"] == 200
    pattern = re.compile(analysis["pattern"])
    assert pattern.match("calls search_flight('BOS', 'DEN'): right tool, 3 results {ok}")
    assert not pattern.match('quotes "BOS"') and not pattern.match("a \\ b") and not pattern.match("caf\u00e9")
    assert not pattern.match("two\nlines")
    assert label_schema(40, 0)["properties"]["step_39"]["required"] == ["judgment"]


def test_answer_budget_is_the_worst_case_answer_by_hand():
    # {"step_0": {"judgment": "GOOD"}}: 1 + 8 ("step_0") + 2 + 20 ({"judgment": "GOOD"}) + 1 = 32 characters,
    # one token each, plus end-of-sequence.
    assert answer_tokens(1, 0) == 33
    # An analysis adds `"analysis": "` (13), its text, and `", ` (3) to each step's object.
    assert answer_tokens(1, 200) == 33 + 16 + 200 == 249
    # Three steps: 1 + 3 * 30 + 2 separators ", " + 1 = 96, + 1; each analysis 216 more.
    assert answer_tokens(3, 200) == 97 + 3 * 216 == 745
    assert answer_tokens(8, 200) == (1 + 8 * 30 + 7 * 2 + 1 + 1) + 8 * 216 == 1985
    # step_10 and step_11 have one digit more: 12 steps = 1 + 10 * 30 + 2 * 31 + 11 * 2 + 1 + 1 = 387.
    assert answer_tokens(12, 0) == 387
    worst = json.loads(worst_case_answer(2, 5))
    assert worst == {"step_0": {"analysis": "xxxxx", "judgment": "GOOD"},
                     "step_1": {"analysis": "xxxxx", "judgment": "GOOD"}}


def test_analysis_shrinks_so_the_worst_case_fits_the_cap():
    assert analysis_chars(3, 2048, 200) == 200  # 745 tokens fit: the full analysis
    assert analysis_chars(8, 2048, 200) == 200  # 1985 fit
    # 12 steps: (2048 - 387) // 12 - 16 = 138 - 16 = 122 characters; 387 + 12 * 138 = 2043 <= 2048.
    assert analysis_chars(12, 2048, 200) == 122 and answer_tokens(12, 122) == 2043
    assert answer_tokens(12, 123) > 2048
    # 40 steps: (2048 - 1311) // 40 - 16 = 2 characters < 20: judgments only.
    assert answer_tokens(40, 0) == 1311 and analysis_chars(40, 2048, 200) == 0
    assert analysis_chars(3, 2048, 10) == 0  # a configured analysis below 20 characters: judgments only
    assert analysis_chars(3, 2048, 50) == 50


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
