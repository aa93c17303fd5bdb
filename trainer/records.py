"""Every training rollout in the run folder, bounded and rotated, for the studio and for audits.

`<output_dir>/rollouts/` holds JSONL shards (`shard-000001.jsonl`, ...) of one record per rollout:
messages, steps, the exact prompt and response tokens (ids and their text), loss mask, step ids,
judge labels with reasons, per-token advantages, the experience flag with the injected experience
ids, and the outcome. `index.jsonl` holds one short line per rollout (ids, step, outcome, flag and
where its record sits: shard, byte offset, length), so a reader seeks to one rollout without
scanning a shard. A shard is closed at `shard_max_bytes`; beyond `max_shards` the oldest shard is
deleted and its index lines dropped, so the folder never grows past about
`shard_max_bytes * max_shards`.

A step's records are acknowledged once `write` returns (the index line follows its records). A kill
mid-write leaves at most a half line at the end of the shard or the index, which a resumed writer cuts off
before it appends (`common.jsonl`); index rewrites at rotation go through a temporary file and a rename.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from common.faults import TRAINER_FAULT_ENV, FaultInjector, check_disk
from common.jsonl import cut_torn_tail
from trainer.protocol import INDEX_NAME, SHARD_PREFIX


class _Tokenizer(Protocol):
    def decode(self, ids: list[int], **kwargs: Any) -> str: ...


class _Rollout(Protocol):
    trajectory: Any
    segments: Sequence[Any]
    invalid_steps: int
    generated_tokens: int
    seconds: float
    policy_versions: list[int]
    synthetic: bool
    experience_text: str | None
    experience_demonstration: list[dict[str, Any]] | None
    demonstration: dict[str, Any] | None
    asks: int
    asks_over_budget: int
    env_host: dict[str, Any] | None


class _StepBatch(Protocol):
    """What the writer reads of a `trainer.step_batch.StepBatch`."""

    advantages: list[list[float]] | None

    @property
    def rollouts(self) -> list[Any]: ...

    def labels(self, rollout: Any) -> list[Any] | None: ...


def shard_number(path: Path) -> int:
    return int(path.stem.removeprefix(SHARD_PREFIX))


def shard_paths(directory: Path) -> list[Path]:
    """The shards present, oldest first."""
    found = [p for p in directory.glob(f"{SHARD_PREFIX}*.jsonl") if p.stem.removeprefix(SHARD_PREFIX).isdigit()]
    return sorted(found, key=shard_number)


class TokenText:
    """The text of single token ids, cached: a vocabulary is small and the same ids recur in every rollout."""

    def __init__(self, tokenizer: _Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            text = self._cache.get(i)
            if text is None:
                text = self._cache[i] = self.tokenizer.decode([i])
            out.append(text)
        return out


def rollout_record(step: int, rollout: _Rollout, advantages: list[float], token_text: TokenText,
                   trained_version: int | None = None, *, labels: list[Any] | None = None) -> dict[str, Any]:
    """`trained_version`: the policy version the update on this rollout started from; `staleness` is how
    many versions older its oldest turn's generator was (0 on-policy; at most 1 with `trainer.overlap`)."""
    t = rollout.trajectory
    versions = [int(v) for v in rollout.policy_versions or [t.policy_version]]
    return {
        "step": step, "trajectory_id": t.trajectory_id, "task_id": t.task_id, "group_id": t.group_id,
        "env_type": t.env_type, "synthetic": rollout.synthetic,
        "outcome": t.outcome, "truncated": t.truncated, "policy_version": t.policy_version,
        "policy_versions": versions, "trained_version": trained_version,
        "staleness": None if trained_version is None else trained_version - min(versions),
        "experience_flag": t.experience_flag, "experience_ids": list(t.experience_ids),
        "experience_text": rollout.experience_text,
        "experience_demonstration": rollout.experience_demonstration,
        # which demonstration (experience id, task kind) the rollout was shown, and its task's own kind
        "demonstration": rollout.demonstration, "task_kind": t.metadata.get("task_kind"),
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in t.messages],
        "steps": [s.model_dump(mode="json", exclude_none=True) for s in t.steps],
        "labels": [label.model_dump(mode="json") for label in labels] if labels is not None else None,
        "prompt_ids": list(t.prompt_ids), "prompt_tokens": token_text(t.prompt_ids),
        "response_ids": list(t.response_ids), "response_tokens": token_text(t.response_ids),
        "loss_mask": list(t.loss_mask), "step_ids": list(t.step_ids), "advantages": advantages,
        # experience.mode action: the episode's asks (each ask step's info["ask"] holds its query and hits)
        "asks": rollout.asks, "asks_over_budget": rollout.asks_over_budget,
        "invalid_steps": rollout.invalid_steps, "generated_tokens": rollout.generated_tokens,
        "seconds": round(rollout.seconds, 3),
        # where the environment instance ran (env_service's ray backend: actor, pid, node_id, node_ip)
        "env_host": rollout.env_host,
    }


def index_entry(record: dict[str, Any], shard: str, offset: int, length: int) -> dict[str, Any]:
    return {"trajectory_id": record["trajectory_id"], "step": record["step"], "task_id": record["task_id"],
            "group_id": record["group_id"], "synthetic": record["synthetic"], "outcome": record["outcome"],
            "policy_version": record["policy_version"], "staleness": record["staleness"],
            "experience_flag": record["experience_flag"], "experience_ids": record["experience_ids"],
            "demonstration": record["demonstration"], "task_kind": record["task_kind"],
            "turns": len(record["steps"]), "tokens": len(record["response_ids"]), "asks": record["asks"],
            "shard": shard, "offset": offset, "length": length}


class RolloutRecords:
    """Appends rollout records to rotated shards and keeps the index in step with what is on disk."""

    def __init__(self, directory: str | Path, tokenizer: _Tokenizer, *, shard_max_bytes: int = 8 * 1024 * 1024,
                 max_shards: int = 16) -> None:
        if shard_max_bytes < 1 or max_shards < 1:
            raise ValueError("shard_max_bytes and max_shards must be positive")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.shard_max_bytes, self.max_shards = shard_max_bytes, max_shards
        self.token_text = TokenText(tokenizer)
        shards = shard_paths(self.directory)
        # A resumed run appends to its last shard.
        self._shard = shards[-1] if shards else self._shard_path(1)
        cut_torn_tail(self._shard)
        cut_torn_tail(self.index_path)
        self.faults = FaultInjector(TRAINER_FAULT_ENV)
        self._written = 0  # records written by this writer (the fault points count them)

    def _shard_path(self, number: int) -> Path:
        return self.directory / f"{SHARD_PREFIX}{number:06d}.jsonl"

    @property
    def index_path(self) -> Path:
        return self.directory / INDEX_NAME

    def write(self, step: int, batch: _StepBatch, *, trained_version: int | None = None) -> int:
        """Record one training step's rollouts with their judge labels and advantages; returns how many were
        written."""
        if batch.advantages is None:
            raise ValueError("the step batch has no advantages yet: estimate them before recording the step")
        check_disk(self._shard)
        entries = []
        for rollout, advantages in zip(batch.rollouts, batch.advantages, strict=True):
            record = rollout_record(step, rollout, [float(a) for a in advantages], self.token_text, trained_version,
                                    labels=batch.labels(rollout))
            line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
            if self._shard.exists() and self._shard.stat().st_size + len(line) > self.shard_max_bytes:
                self._rotate()
            self._written += 1
            with self._shard.open("ab") as f:
                offset = f.tell()
                self.faults.write_record(f, line, "rollouts", self._written)
            entries.append(index_entry(record, self._shard.name, offset, len(line)))
        with self.index_path.open("ab") as f:
            data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode()
            self.faults.write_record(f, data, "rollout_index", self._written)
        return len(entries)

    def _rotate(self) -> None:
        self._shard = self._shard_path(shard_number(self._shard) + 1)
        shards = shard_paths(self.directory)
        excess = len(shards) + 1 - self.max_shards  # the new shard counts
        if excess <= 0:
            return
        dropped = {p.name for p in shards[:excess]}
        # The index first (atomically), then the files: a reader never finds an entry without its shard.
        kept = [line for line in self._index_lines() if json.loads(line)["shard"] not in dropped]
        tmp = self.index_path.with_name(f".{INDEX_NAME}.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.index_path)
        for path in shards[:excess]:
            path.unlink(missing_ok=True)

    def _index_lines(self) -> list[str]:
        if not self.index_path.is_file():
            return []
        return [line + "\n" for line in self.index_path.read_text().splitlines() if line.strip()]
