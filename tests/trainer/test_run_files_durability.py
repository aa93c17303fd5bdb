"""The trainer's own files (rollout shards, their index, metrics.jsonl, checkpoints) under a kill mid-write
and a full disk.

A forked child writes steps as the trainer does (each step's rollout records, then its metrics line) and
reports each step once both calls returned: the ledger of acknowledged writes. The fault hook
(EVOLVER_TRAINER_FAULT=<op>:torn:<n>) SIGKILLs it halfway through the n-th record of one file. A second
child opens the same folder, as a resumed trainer does, and writes the steps after the last acknowledged
one. Then every line of every file must parse, every index entry must point at its record, and every
acknowledged step must be there: a writer that appended after the torn half without cutting it off would
glue the next record onto it and fail here. (Forked, so the children skip the imports: a kill is a kill.)
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from pathlib import Path

import pytest

from common.faults import DISK_FULL_ENV, TRAINER_FAULT_ENV, DiskFull
from engine.models import load_tokenizer
from tests.studio.test_records import rollout
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.metrics import MetricsLog
from trainer.records import RolloutRecords
from trainer.step_batch import StepBatch

STEPS, ROLLOUTS_PER_STEP = 6, 2


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny")


def trajectory_ids(step: int) -> set[str]:
    return {f"traj_{step * 10 + i:04d}" for i in range(ROLLOUTS_PER_STEP)}


def write_steps(out: Path, tokenizer, first: int, last: int, fault: str | None = None) -> tuple[int, list[int]]:
    """In a forked child: steps first..last; returns its exit code and the steps it acknowledged."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.environ.pop(TRAINER_FAULT_ENV, None)
            if fault:
                os.environ[TRAINER_FAULT_ENV] = fault
            records, metrics = RolloutRecords(out / "rollouts", tokenizer), MetricsLog(out, tensorboard=False)
            for step in range(first, last + 1):
                group = [rollout(step * 10 + i, tokenizer) for i in range(ROLLOUTS_PER_STEP)]
                advantages = [[0.5] * len(r.trajectory.response_ids) for r in group]
                records.write(step, StepBatch([group], advantages=advantages))
                metrics.log(step, {"rollout/reward_mean": step / 10})
                os.write(write_end, f"{step}\n".encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as acks:
        acked = [int(line) for line in acks.read().split()]
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), acked


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # a torn or glued line fails here


@pytest.mark.parametrize("fault", ["rollouts:torn:5", "rollout_index:torn:6", "metrics:torn:2"])
def test_a_kill_inside_a_write_loses_no_acknowledged_step(tmp_path, tokenizer, fault):
    code, acked = write_steps(tmp_path, tokenizer, 1, STEPS, fault)
    assert code == -signal.SIGKILL, "the fault point was reached"
    assert 1 <= len(acked) < STEPS and acked == list(range(1, len(acked) + 1))
    code, resumed = write_steps(tmp_path, tokenizer, acked[-1] + 1, STEPS)
    assert code == 0 and resumed == list(range(acked[-1] + 1, STEPS + 1))

    rollouts = tmp_path / "rollouts"
    index = lines(rollouts / "index.jsonl")
    for shard in rollouts.glob("shard-*.jsonl"):
        lines(shard)
    for entry in index:
        with (rollouts / entry["shard"]).open("rb") as f:
            f.seek(entry["offset"])
            assert json.loads(f.read(entry["length"]))["trajectory_id"] == entry["trajectory_id"]
    # Every step, the acknowledged ones first of all, with all its rollouts (the step the kill interrupted
    # may keep a record of its first try beside the redone ones: it was never acknowledged).
    for step in range(1, STEPS + 1):
        assert {e["trajectory_id"] for e in index if e["step"] == step} == trajectory_ids(step), step
    assert [r["step"] for r in lines(tmp_path / "metrics.jsonl")] == list(range(1, STEPS + 1))


def test_a_full_disk_fails_the_write_and_keeps_every_file_as_it_was(tmp_path, tokenizer, monkeypatch):
    """EVOLVER_DISK_FULL names a flag file: while it exists, each write raises ENOSPC naming its file."""
    flag = tmp_path / "disk-full"
    monkeypatch.setenv(DISK_FULL_ENV, str(flag))
    out, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    records, metrics = RolloutRecords(out / "rollouts", tokenizer), MetricsLog(out, tensorboard=False)
    group = [rollout(i, tokenizer) for i in range(ROLLOUTS_PER_STEP)]
    batch = StepBatch([group], advantages=[[0.5] * len(r.trajectory.response_ids) for r in group])
    records.write(1, batch)
    metrics.log(1, {"rollout/reward_mean": 0.1})
    save_checkpoint(checkpoints, 1, {"weights": [1.0]})
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    flag.touch()
    for write, path in ((lambda: records.write(2, batch), out / "rollouts" / "shard-000001.jsonl"),
                        (lambda: metrics.log(2, {"rollout/reward_mean": 0.2}), out / "metrics.jsonl"),
                        (lambda: save_checkpoint(checkpoints, 2, {"weights": [2.0]}), checkpoints / "step_000002.tmp")):
        with pytest.raises(DiskFull) as failure:
            write()
        assert failure.value.filename == str(path)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before, "no file changed, none left behind"
    assert load_checkpoint(latest_checkpoint(checkpoints))["step"] == 1

    flag.unlink()  # space again: the same writers go on
    records.write(2, batch)
    metrics.log(2, {"rollout/reward_mean": 0.2})
    save_checkpoint(checkpoints, 2, {"weights": [2.0]})
    assert [r["step"] for r in lines(out / "metrics.jsonl")] == [1, 2]
    assert [e["step"] for e in lines(out / "rollouts" / "index.jsonl")] == [1] * ROLLOUTS_PER_STEP + [2] * ROLLOUTS_PER_STEP
    assert load_checkpoint(latest_checkpoint(checkpoints))["step"] == 2
