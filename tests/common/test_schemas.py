"""Wire schemas round-trip through JSON unchanged and reject inconsistent token fields."""

import math

import pytest
from pydantic import ValidationError

from common.schemas import (
    CONTENT_MAX_CHARS,
    WHEN_TO_USE_MAX_CHARS,
    ChatMessage,
    Experience,
    ExperienceKind,
    Step,
    StepLabel,
    Task,
    ToolCall,
    ToolFunction,
    Trajectory,
)
from experience_manager.protocol import ExperienceCreate, ExperiencePatch, ImportItem


def roundtrip(model):
    again = type(model).model_validate_json(model.model_dump_json())
    assert again == model
    return again


def test_trajectory_roundtrip():
    call = ToolCall(function=ToolFunction(name="search_flight", arguments='{"origin": "SFO"}'))
    traj = Trajectory(
        task_id="flights_3", group_id="g1", env_type="flights",
        messages=[ChatMessage(role="user", content="book"), ChatMessage(role="assistant", content=None, tool_calls=[call])],
        steps=[Step(index=0, action=ChatMessage(role="assistant", content="x"),
                    observation=ChatMessage(role="user", content="ok"), state_hash="ab12")],
        outcome=1.0, prompt_ids=[1, 2], response_ids=[5, 6, 7], loss_mask=[1, 1, 0], step_ids=[0, 0, 0],
        logprobs=[-0.1, -0.2, 0.0], experience_flag=True, experience_ids=["exp_1"], policy_version=3,
        labels=[StepLabel(step=0, label="GOOD", reason="searched first")],
    )
    again = roundtrip(traj)
    assert again.labels[0].value == 1.0 and again.messages[1].tool_calls[0].function.name == "search_flight"


def test_task_and_experience_roundtrip():
    task = Task(task_id="syn_1", env_type="flights", query="Book SFO->JFK", seed_task_id="flights_0", synthetic=True)
    assert roundtrip(task).env_task_id == "flights_0"
    assert task.create_params() == {"query": "Book SFO->JFK"}
    exp = Experience(when_to_use="booking a flight", content="search before booking", kind=ExperienceKind.success)
    again = roundtrip(exp)
    assert again.usage.utility == pytest.approx(0.5)


def test_token_fields_must_align():
    with pytest.raises(ValidationError, match="loss_mask has 2 entries but response_ids has 3"):
        Trajectory(task_id="t", response_ids=[1, 2, 3], loss_mask=[1, 1])


def test_non_finite_outcome_rejected():
    with pytest.raises(ValidationError, match="finite"):
        Trajectory(task_id="t", outcome=math.nan)


def test_unknown_fields_rejected():
    with pytest.raises(ValidationError, match="extra"):
        Task.model_validate({"task_id": "a", "env_type": "x", "reference": "secret"})


@pytest.mark.parametrize("model", [Experience, ExperienceCreate, ExperiencePatch, ImportItem],
                         ids=lambda m: m.__name__)
def test_every_model_of_experience_text_keeps_the_same_limits(model):
    for field, limit in (("when_to_use", WHEN_TO_USE_MAX_CHARS), ("content", CONTENT_MAX_CHARS)):
        other = "when_to_use" if field == "content" else "content"
        assert getattr(model(**{field: "x" * limit, other: "y"}), field) == "x" * limit
        for bad in ("", "x" * (limit + 1)):
            with pytest.raises(ValidationError, match=field):
                model(**{field: bad, other: "y"})
