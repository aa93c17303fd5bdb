"""Fast unit tests of the pure parts: query extraction, markup rules, BM25, journal, rendering."""

from __future__ import annotations

import json

from experience_manager.journal import Journal
from experience_manager.lexical import BM25Index
from experience_manager.render import render_experiences
from experience_manager.summarize import heuristic_case, parse_items, validate_text
from experience_manager.text import content_hash, forbidden_markup, query_text, valid_id
from experience_manager.trajectories import build_view
from tests.experience_manager.conftest import chat_trajectory


def test_query_text_reduces_a_message_list_to_the_user_task():
    messages = [{"role": "system", "content": "long system prompt " * 100},
                {"role": "user", "content": "\n\nSome Related Experience to help you to complete the task:"
                                            "<EXP>old advice</EXP>\n\nBook a taxi to the airport"}]
    assert query_text(json.dumps(messages)) == "Book a taxi to the airport"
    assert query_text(json.dumps({"messages": messages})) == "Book a taxi to the airport"
    assert query_text("  plain   task text ") == "plain task text"
    assert query_text("[1, 2]") == "[1, 2]"  # JSON, but not messages: used as text


def test_markup_rules_and_ids():
    for bad in ("<EXP>", "</exp>", "<experience>", "<|im_start|>", "</s>", "[INST]", "<|eot_id|>"):
        assert forbidden_markup(f"text {bad} more") == bad
    assert forbidden_markup("use a <b>bold</b> tag and x < y") is None
    assert valid_id("ws_1-a") and not valid_id("ws 1") and not valid_id("a" * 65) and not valid_id("")
    assert content_hash("A  b", "C") == content_hash("a b", "c")


def test_bm25_ranks_matching_terms_and_handles_removal():
    index = BM25Index()
    index.set(0, "send an email to a contact")
    index.set(1, "book a flight ticket")
    index.set(2, "read unread emails in the inbox")
    scores = index.scores("email my manager", 3)
    assert scores[0] > 0 and scores[2] > 0 and scores[1] == 0
    index.remove(0)
    assert index.scores("email", 3)[0] == 0 and len(index) == 2


def test_llm_items_are_validated():
    items, problem = parse_items('```json\n[{"when_to_use": "When booking flights", '
                                 '"experience": "Search before booking; use the returned id."}]\n```', "Book a flight", 3)
    assert problem is None and len(items) == 1
    assert "not valid JSON" in parse_items("Sure!", "task", 3)[1]
    assert "at most 3" in parse_items(json.dumps([{"when_to_use": "x" * 20, "experience": "y" * 30}] * 4), "t", 3)[1]
    assert "restates" in validate_text("When asked to book", "Book a flight from Paris to Rome",
                                       "Book a flight from Paris to Rome")
    assert "forbidden" in validate_text("When booking a flight", "Use <EXP> here please ok", None)


def test_heuristic_case_names_the_difference_between_outcomes():
    ok = chat_trajectory("t", "Cancel order 42", [("get_orders", {"user": "u"}), ("cancel_order", {"id": 42})], 1.0)
    bad = chat_trajectory("t", "Cancel order 42", [("cancel_order", {"id": 42})], 0.0, error="Error: not found")
    views = [build_view(messages=t["messages"], reward=t["outcome"], success_threshold=1.0, trajectory_id=None,
                        task_id="t", query=None) for t in (ok, bad)]
    case = heuristic_case(views)
    assert case.when_to_use == "Cancel order 42" and case.tools == ["get_orders", "cancel_order"]
    assert "Successful runs called get_orders; failed runs did not." in case.content
    assert "Last error of a failed attempt: Error: not found." in case.content


def test_render_matches_reme_format():
    assert render_experiences([("w1", "c1"), ("w2", "c2")]) == \
        "Memory 1 :\n When to use: w1\n Content: c1\n\nMemory 2 :\n When to use: w2\n Content: c2\n"
    assert render_experiences([]) == ""


def test_journal_drops_a_torn_last_record(tmp_path):
    journal = Journal(tmp_path / "j.jsonl")
    journal.append({"t": "intent", "op_id": "a"})
    journal.close()
    with open(tmp_path / "j.jsonl", "ab") as handle:
        handle.write(b'{"t": "commit", "op_')
    assert Journal(tmp_path / "j.jsonl").read() == [{"t": "intent", "op_id": "a"}]
    assert (tmp_path / "j.jsonl").read_bytes().endswith(b"}\n")


# ---------------------------------------------------------------- demonstrations


def _view(messages: list[dict], reward: float):
    from experience_manager.trajectories import build_view
    return build_view(messages=messages, reward=reward, success_threshold=1.0, trajectory_id="t", task_id="k",
                      query=None)


def test_demonstration_is_kept_whole_within_the_caps_or_not_at_all():
    from experience_manager.demonstration import demonstration_of
    messages = [{"role": "system", "content": "sys"},
                {"role": "user", "content": "Find A <EXP>old advice</EXP>"},
                {"role": "assistant", "content": "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"},
                {"role": "tool", "content": "x" * 50}, {"role": "assistant", "content": "A is 3."}]
    demo = demonstration_of(_view(messages, 1.0), max_messages=4, max_chars=200)
    # The injected block is not part of the demonstrated query; the rest is as written.
    assert demo == [{"role": "user", "content": "Find A"}, *messages[2:]]
    assert demonstration_of(_view(messages, 1.0), max_messages=3, max_chars=200) is None  # 4 messages
    assert demonstration_of(_view(messages, 1.0), max_messages=4, max_chars=80) is None  # 6 + 49 + 50 + 7 chars
    assert demonstration_of(_view(messages, 0.5), max_messages=4, max_chars=200) is None  # not a success
    special = [*messages[:3], {"role": "tool", "content": "<|im_start|>x"}, messages[4]]
    assert demonstration_of(_view(special, 1.0), max_messages=4, max_chars=200) is None


def test_experiences_stored_before_demonstrations_still_load():
    from common.schemas import Experience
    old = {"experience_id": "exp_1", "when_to_use": "when booking", "content": "search, then book the cheapest"}
    assert Experience.model_validate(old).demonstration is None
