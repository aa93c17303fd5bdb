"""Golden tests of the context templates with the tiny tokenizer.

Expected sequences are written out token by token from the tokenizer's vocabulary (the ChatML
layout `<|im_start|>role\\ncontent<|im_end|>\\n`), not snapshots of the code's own output.
"""

import pytest

from engine.models import load_tokenizer
from trainer.templates import make_template


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def ids(tok, *tokens):
    out = tok.convert_tokens_to_ids(list(tokens))
    assert tok.unk_token_id not in out or "<|endoftext|>" in tokens, f"a token is not in the vocabulary: {tokens}"
    return out


NL = "Ċ"
START = ["<|im_start|>", "system", NL, "P", "l", "ay", ".", "<|im_end|>", NL,
         "<|im_start|>", "user", NL, "go", "Ġleft", "Ġor", "Ġright", "<|im_end|>", NL,
         "<|im_start|>", "assistant", NL]
MESSAGES = [{"role": "system", "content": "Play."}, {"role": "user", "content": "go left or right"}]
OBS_DOOR = [NL, "<|im_start|>", "user", NL, "you", "Ġse", "e", "Ġa", "Ġdoor", "<|im_end|>", NL,
            "<|im_start|>", "assistant", NL]


def generate(tok, *tokens):
    """The policy's output ids, given as tokens (what a model would have sampled)."""
    return ids(tok, *tokens)


def test_linear_two_turns(tok):
    t = make_template("linear", tok)
    t.start(MESSAGES)
    assert t.generation_context() == ids(tok, *START)
    g0 = generate(tok, "go", "Ġleft", "<|im_end|>")
    assert t.add_turn(0, g0, "go left") == "go left"
    t.add_observation("you see a door")
    assert t.generation_context() == ids(tok, *START, "go", "Ġleft", "<|im_end|>", *OBS_DOOR)
    g1 = generate(tok, "right", "<|im_end|>")
    t.add_turn(1, g1, "right")

    [seg] = t.segments()
    assert seg.prompt_ids == ids(tok, *START)
    assert seg.response_ids == ids(tok, "go", "Ġleft", "<|im_end|>", *OBS_DOOR, "right", "<|im_end|>")
    assert seg.loss_mask == [1, 1, 1] + [0] * len(OBS_DOOR) + [1, 1]
    assert seg.step_ids == [0, 0, 0] + [0] * len(OBS_DOOR) + [1, 1]
    # The generated ids in the sample are the policy's, unchanged.
    assert [i for i, m in zip(seg.response_ids, seg.loss_mask, strict=True) if m] == g0 + g1


def test_truncated_generation_gets_closed_by_the_template(tok):
    t = make_template("linear", tok)
    t.start(MESSAGES)
    t.add_turn(0, generate(tok, "go"), "go")  # hit max_tokens: no <|im_end|> generated
    t.add_observation("you see a door")
    [seg] = t.segments()
    assert seg.response_ids == ids(tok, "go", "<|im_end|>", *OBS_DOOR)
    assert seg.loss_mask == [1] + [0] * (1 + len(OBS_DOOR))


def test_experience_is_absent_from_the_training_sample(tok):
    t = make_template("linear", tok)
    t.start(MESSAGES, experience="go left")
    exp_user = ["<|im_start|>", "user", NL, "<", "E", "X", "P", ">", NL, "go", "Ġleft", NL, "</", "E", "X", "P", ">",
                NL, NL,
                "go", "Ġleft", "Ġor", "Ġright", "<|im_end|>", NL]
    expected_generation_prompt = START[:9] + exp_user + ["<|im_start|>", "assistant", NL]
    assert t.generation_context() == ids(tok, *expected_generation_prompt)
    g0 = generate(tok, "go", "Ġleft", "<|im_end|>")
    t.add_turn(0, g0, "go left")
    t.add_observation("you see a door")
    assert t.generation_context()[-len(OBS_DOOR):] == ids(tok, *OBS_DOOR)
    [seg] = t.segments()
    assert seg.prompt_ids == ids(tok, *START)  # no <EXP> tokens at all
    assert ids(tok, "</")[0] not in seg.prompt_ids
    assert seg.response_ids[:3] == g0


def test_linear_think_sends_only_the_action(tok):
    t = make_template("linear_think", tok)
    t.start(MESSAGES)
    text = "<think>the door is left</think>go left"
    g0 = generate(tok, "<", "think", ">", "the", "Ġdoor", "Ġis", "Ġleft", "</", "think", ">", "go", "Ġleft",
                  "<|im_end|>")
    assert t.add_turn(0, g0, text) == "go left"
    [seg] = t.segments()
    assert seg.response_ids == g0 and seg.loss_mask == [1] * len(g0)  # reasoning tokens are trained too
    assert t.action_text("<think>never closed") == ""


def test_sliding_window_keeps_the_last_turns(tok):
    t = make_template("sliding_window", tok, window=1)
    t.start(MESSAGES)
    g0 = generate(tok, "go", "Ġleft", "<|im_end|>")
    t.add_turn(0, g0, "go left")
    t.add_observation("you see a door")
    g1 = generate(tok, "right", "<|im_end|>")
    t.add_turn(1, g1, "right")
    t.add_observation("you see a door")
    # Window 1: the policy sees the prompt and only turn 1 (turn 0 slid out).
    turn1 = ["right", "<|im_end|>", *OBS_DOOR]
    assert t.generation_context() == ids(tok, *START, *turn1)
    g2 = generate(tok, "go", "<|im_end|>")
    t.add_turn(2, g2, "go")
    segs = t.segments()
    assert len(segs) == 2
    assert segs[0].prompt_ids == ids(tok, *START)
    assert segs[0].response_ids == g0 + ids(tok, *OBS_DOOR) + g1 + ids(tok, *OBS_DOOR)
    assert segs[0].step_ids == [0] * (3 + len(OBS_DOOR)) + [1] * (2 + len(OBS_DOOR))
    assert segs[1].prompt_ids == ids(tok, *START, *turn1)
    assert segs[1].response_ids == g2 and segs[1].loss_mask == [1, 1] and segs[1].step_ids == [2, 2]


def test_self_managed_drops_turns_the_model_names(tok):
    t = make_template("self_managed", tok)
    t.start(MESSAGES)
    t.add_turn(0, generate(tok, "go", "Ġleft", "<|im_end|>"), "go left")
    t.add_observation("you see a door")
    action = t.add_turn(1, generate(tok, "right", "<|im_end|>"), "<drop>1</drop> right")
    assert action == "right"
    t.add_observation("you see a door")
    assert t.generation_context() == ids(tok, *START, "right", "<|im_end|>", *OBS_DOOR)
    assert len(t.segments()) == 1  # the new segment has no generated tokens yet
    t.add_turn(2, generate(tok, "go", "<|im_end|>"), "go")
    assert [s.step_ids[-1] for s in t.segments()] == [1, 2]


def test_unknown_template_is_a_clear_error(tok):
    with pytest.raises(ValueError, match="choose one of linear, linear_think, sliding_window, self_managed"):
        make_template("zigzag", tok)


def test_demonstration_turns_render_observations_as_user_turns_and_calls_as_text():
    from trainer.templates import demonstration_turns
    demo = [{"role": "user", "content": "Find Ann."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "get_passenger", "arguments": '{"name": "Ann"}'}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "P1"},
            {"role": "assistant", "content": "Ann is P1."}]
    assert demonstration_turns(demo) == [
        {"role": "user", "content": "Find Ann."},
        {"role": "assistant", "content": '<tool_call>{"name": "get_passenger", "arguments": {"name": "Ann"}}</tool_call>'},
        {"role": "user", "content": "P1"},
        {"role": "assistant", "content": "Ann is P1."}]


# ---------------------------------------------------------------- demonstrations that fit (issue 14)

DEMO = [{"role": "user", "content": "go left"}, {"role": "assistant", "content": "go left"},
        {"role": "tool", "content": "you see a door you see a door"}, {"role": "assistant", "content": "right"}]
DEMO_TOKENS = ["<|im_start|>", "user", NL, "go", "Ġleft", "<|im_end|>", NL,
               "<|im_start|>", "assistant", NL, "go", "Ġleft", "<|im_end|>", NL,
               "<|im_start|>", "user", NL, "you", "Ġse", "e", "Ġa", "Ġdoor", "Ġyou", "Ġse", "e", "Ġa", "Ġdoor",
               "<|im_end|>", NL,
               "<|im_start|>", "assistant", NL, "right", "<|im_end|>", NL]
# The observation cut to 2 tokens, then " ..." (what the policy is shown instead of the whole result).
DEMO_CUT_TOKENS = [*DEMO_TOKENS[:17], "you", "Ġse", "Ġ", ".", ".", ".", *DEMO_TOKENS[27:]]
SYSTEM = START[:9]
TASK = START[9:]


def test_demonstration_turns_end_with_the_assistant_and_alternate():
    from trainer.templates import demonstration_turns

    # A replayed reference ends at its last call's observation; a multi-call turn has two observations.
    demo = [{"role": "user", "content": "Book it."}, {"role": "assistant", "content": "a()\nb()"},
            {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"},
            {"role": "assistant", "content": "c()"}, {"role": "tool", "content": "booked"}]
    assert demonstration_turns(demo) == [
        {"role": "user", "content": "Book it."}, {"role": "assistant", "content": "a()\nb()"},
        {"role": "user", "content": "A\nB"}, {"role": "assistant", "content": "c()"}]


def test_demonstration_ending_at_an_observation_is_shown_without_it(tok):
    t = make_template("linear", tok)
    t.start(MESSAGES, demonstration=[*DEMO[:2], {"role": "tool", "content": "you see a door"}])
    # system, the demonstrated query, its call, then the task: never two user turns in a row.
    assert t.generation_context() == ids(tok, *SYSTEM, *DEMO_TOKENS[:14], *TASK)
    assert t.demonstration_fit == "whole"


def test_demonstration_budget_reserves_a_generation_per_shown_turn_and_the_observations_between(tok):
    from trainer.templates import DemonstrationBudget, demonstration_turns

    turns = demonstration_turns(DEMO)  # two assistant turns, one 10-token observation between them
    count = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
    assert DemonstrationBudget(64, 4, 2).reserve(turns, count) == 2 * 64 + 10
    assert DemonstrationBudget(64, 1, 2).reserve(turns, count) == 64  # one turn: no observation to expect


def test_demonstration_is_shortened_then_dropped_when_it_leaves_too_little_room(tok):
    from trainer.templates import DemonstrationBudget

    whole = ids(tok, *SYSTEM, *DEMO_TOKENS, *TASK)
    cut = ids(tok, *SYSTEM, *DEMO_CUT_TOKENS, *TASK)
    plain = ids(tok, *START)
    budget = DemonstrationBudget(max_new_tokens=5, max_turns=4, observation_tokens=2)
    reserve = 2 * 5 + 10  # the episode's two turns and an observation as long as the demonstration's, uncut
    for max_context, fit, expected in ((len(whole) + reserve, "whole", whole),
                                       (len(whole) + reserve - 1, "shortened", cut),
                                       (len(cut) + reserve, "shortened", cut),
                                       (len(cut) + reserve - 1, "dropped", plain)):
        t = make_template("linear", tok, max_context)
        t.start(MESSAGES, demonstration=DEMO, budget=budget)
        assert (t.demonstration_fit, t.generation_context()) == (fit, expected), max_context
        assert t.budget() >= reserve or fit == "dropped"
        # Whatever the policy was shown, the training prompt is the plain one.
        g = generate(tok, "go", "<|im_end|>")
        t.add_turn(0, g, "go")
        assert t.segments()[0].prompt_ids == plain
