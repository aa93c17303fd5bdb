"""The rollout records in the run folder: every field the studio shows (the step batch's labels and
advantages included), and the bound: shards rotate and the oldest go, with their index lines."""

from __future__ import annotations

import json

import pytest

from common.schemas import ChatMessage, Step, StepLabel, Trajectory
from engine.models import load_tokenizer
from judge.client import TrajectoryJudgment
from trainer.records import RolloutRecords, shard_paths
from trainer.rollout import Rollout
from trainer.step_batch import StepBatch
from trainer.templates import Segment


def rollout(i: int, tokenizer, *, flagged: bool = False) -> Rollout:
    ids = tokenizer.encode("book a flight", add_special_tokens=False)[:3]
    response = ids + ids  # step 0 (policy) then step 1 (observation, mask 0)
    trajectory = Trajectory(
        trajectory_id=f"traj_{i:04d}", task_id="t1", group_id="g1", env_type="flights",
        messages=[ChatMessage(role="user", content="book")],
        steps=[Step(index=0, action=ChatMessage(role="assistant", content="search()"), reward=0.0)],
        outcome=1.0, prompt_ids=ids, response_ids=response, loss_mask=[1] * len(ids) + [0] * len(ids),
        step_ids=[0] * len(ids) + [1] * len(ids), experience_flag=flagged,
        experience_ids=["exp_a"] if flagged else [])
    half = len(ids)
    segments = [Segment(ids, response[:half], [1] * half, [0] * half),
                Segment(ids, response[half:], [0] * half, [1] * half)]
    return Rollout(trajectory, segments, generated_tokens=half,
                   experience_text="Search before booking." if flagged else None)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def test_a_record_holds_tokens_mask_steps_labels_advantages_and_the_experience_flag(tmp_path, tokenizer):
    records = RolloutRecords(tmp_path / "rollouts", tokenizer)
    r = rollout(1, tokenizer, flagged=True)
    n = len(r.trajectory.response_ids) // 2
    judged = TrajectoryJudgment(trajectory_id=r.trajectory.trajectory_id,
                                labels=[StepLabel(step=0, label="GOOD", reason="searched")])
    batch = StepBatch([[r]], {judged.trajectory_id: judged}, advantages=[[0.25] * (2 * n)])
    assert records.write(4, batch) == 1
    entry = json.loads((tmp_path / "rollouts" / "index.jsonl").read_text())
    with (tmp_path / "rollouts" / entry["shard"]).open("rb") as f:
        f.seek(entry["offset"])
        record = json.loads(f.read(entry["length"]))
    assert entry["step"] == record["step"] == 4 and entry["experience_flag"] is record["experience_flag"] is True
    assert record["experience_text"] == "Search before booking."
    assert record["experience_ids"] == ["exp_a"] and record["labels"] == [
        {"step": 0, "label": "GOOD", "reason": "searched"}]
    assert record["loss_mask"] == [1] * n + [0] * n and record["step_ids"] == [0] * n + [1] * n
    assert record["advantages"] == [0.25] * (2 * n)
    assert "".join(record["response_tokens"][:n]) == tokenizer.decode(r.trajectory.response_ids[:n])
    assert len(record["prompt_tokens"]) == len(record["prompt_ids"]) == n


def test_shards_rotate_and_the_oldest_go_with_their_index_lines(tmp_path, tokenizer):
    def step(r: Rollout) -> StepBatch:
        return StepBatch([[r]], advantages=[[0.0] * len(r.trajectory.response_ids)])

    probe = RolloutRecords(tmp_path / "probe", tokenizer)
    probe.write(1, step(rollout(0, tokenizer)))
    size = (tmp_path / "probe" / "shard-000001.jsonl").stat().st_size
    # Two records fit a shard (ids of equal width keep every record the same size); three shards are kept.
    records = RolloutRecords(tmp_path / "rollouts", tokenizer, shard_max_bytes=2 * size + 10, max_shards=3)
    for i in range(1, 10):
        records.write(i, step(rollout(i, tokenizer)))
    names = [p.name for p in shard_paths(tmp_path / "rollouts")]
    # 9 records, 2 a shard: shards 1..5; only the newest 3 remain.
    assert names == ["shard-000003.jsonl", "shard-000004.jsonl", "shard-000005.jsonl"]
    index = [json.loads(line) for line in (tmp_path / "rollouts" / "index.jsonl").read_text().splitlines()]
    assert [e["trajectory_id"] for e in index] == [f"traj_{i:04d}" for i in range(5, 10)]
    assert {e["shard"] for e in index} == set(names)
    # A resumed writer appends to the last shard.
    again = RolloutRecords(tmp_path / "rollouts", tokenizer, shard_max_bytes=2 * size + 10, max_shards=3)
    again.write(10, step(rollout(10, tokenizer)))
    assert [p.name for p in shard_paths(tmp_path / "rollouts")][-1] == "shard-000005.jsonl"
