"""The run's rollout records (written by `trainer.records`): the index, one record, and views of them."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from html import escape
from typing import Any

from markupsafe import Markup

from studio.runs import ITEM_ID, JsonLines, Run, not_found
from trainer.protocol import INDEX_NAME, SHARD_PREFIX


class Rollouts:
    def __init__(self, lines: JsonLines) -> None:
        self.lines = lines

    def index(self, run: Run) -> list[dict[str, Any]]:
        return self.lines.read(run.rollouts_dir / INDEX_NAME)

    def entry(self, run: Run, trajectory_id: str) -> dict[str, Any]:
        if ITEM_ID.fullmatch(trajectory_id):
            for entry in reversed(self.index(run)):
                if entry["trajectory_id"] == trajectory_id:
                    return entry
        raise not_found("rollout", f"run {run.name!r} has no rollout {trajectory_id[:80]!r} (it may have been "
                                   f"rotated out: the run folder keeps the most recent shards)")

    def record(self, run: Run, trajectory_id: str) -> dict[str, Any]:
        entry = self.entry(run, trajectory_id)
        shard = entry["shard"]
        path = run.rollouts_dir / shard
        if not (shard.startswith(SHARD_PREFIX) and "/" not in shard and path.is_file()):
            raise not_found("rollout", f"the shard {shard!r} of rollout {trajectory_id!r} is gone (rotated out)")
        with path.open("rb") as f:
            f.seek(entry["offset"])
            return json.loads(f.read(entry["length"]))

    def group(self, run: Run, entry: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in self.index(run) if e["group_id"] == entry["group_id"] and e["step"] == entry["step"]]

    def users(self, run: Run) -> dict[str, list[dict[str, Any]]]:
        """experience id -> the rollouts it was injected into."""
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in self.index(run):
            for experience_id in entry.get("experience_ids") or []:
                out[experience_id].append(entry)
        return out


@dataclass
class Turn:
    index: int
    action: str
    observation: str
    reward: float
    label: str | None
    reason: str
    advantage: float | None  # mean over the step's policy tokens
    tokens: list[tuple[str, int, float]] = field(default_factory=list)  # text, mask, advantage
    # experience.mode action: the step was an ask of the pool ({query, hits: [{id, score, text}], over_budget,
    # withheld}); mode step: the search made before it ({query, hits})
    ask: dict[str, Any] | None = None
    retrieval: dict[str, Any] | None = None

    @property
    def spans(self) -> Markup:
        return token_spans(self.tokens)


def token_spans(tokens: list[tuple[str, int, float | None]]) -> Markup:
    """One span per token, classed by its loss mask, its advantage (if any) on hover. Built here, not in
    the template: a 20-turn rollout has thousands of tokens and a template loop is several times slower."""
    def span(text: str, mask: int, adv: float | None) -> str:
        title = "" if adv is None else f' title="advantage {adv:.3f}"'
        return f'<span class="t m{mask}"{title}>{escape(text)}</span>'

    return Markup("".join(span(text, mask, adv) for text, mask, adv in tokens))


def turns(record: dict[str, Any]) -> list[Turn]:
    """The record's steps with their labels, advantages and response tokens (by step id)."""
    labels = {label["step"]: label for label in record.get("labels") or []}
    by_step: dict[int, list[tuple[str, int, float]]] = defaultdict(list)
    for text, mask, step, adv in zip(record["response_tokens"], record["loss_mask"], record["step_ids"],
                                     record["advantages"] or [0.0] * len(record["loss_mask"]), strict=False):
        by_step[step].append((text, mask, adv))
    out = []
    for step in record["steps"]:
        i = step["index"]
        tokens = by_step.get(i, [])
        policy = [a for _, m, a in tokens if m]
        label = labels.get(i)
        info = step.get("info") or {}
        out.append(Turn(i, (step.get("action") or {}).get("content") or "",
                        (step.get("observation") or {}).get("content") or "", float(step.get("reward") or 0.0),
                        label["label"] if label else None, label.get("reason", "") if label else "",
                        sum(policy) / len(policy) if policy else None, tokens,
                        _search(info.get("ask")), _search(info.get("retrieval"))))
    return out


def _search(record: Any) -> dict[str, Any] | None:
    """An ask's or a step retrieval's record with its hits in a shape the page can read whatever was stored."""
    if not isinstance(record, dict):
        return None
    hits = [h for h in record.get("hits") or [] if isinstance(h, dict)]
    return {**record, "query": str(record.get("query") or ""),
            "hits": [{"id": str(h.get("id", "")), "score": h.get("score"), "text": str(h.get("text", ""))}
                     for h in hits]}


def pass_rates_by_step(index: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per training step, the success rate of original and of synthetic tasks' rollouts (what the
    trainer reports to the curriculum)."""
    buckets: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in index:
        kind = "synthetic" if e.get("synthetic") else "original"
        buckets[(kind, e["step"])].append(float((e.get("outcome") or 0.0) >= 1.0))
    series: dict[str, list[tuple[float, float]]] = {}
    for (kind, step), values in sorted(buckets.items(), key=lambda kv: kv[0][1]):
        series.setdefault(f"{kind} tasks", []).append((float(step), sum(values) / len(values)))
    return series
