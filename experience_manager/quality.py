"""Retrieval quality on the fixture: calibrate thresholds on one half, report scores on the other.

`python -m experience_manager.quality` prints the calibrated thresholds (the defaults in settings.py
come from it) and the held-out scores of hybrid retrieval beside a BM25 baseline and dense-only.
The pool of every query is all gold experiences plus all near-miss distractors.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.embeddings import Embedder, shared_embedder
from common.schemas import Experience
from experience_manager.index import WorkspaceIndex
from experience_manager.text import content_hash

FIXTURE = Path(__file__).parent / "fixtures" / "retrieval.json"
THRESHOLD_GRID = np.round(np.arange(0.0, 1.01, 0.01), 2)
LEXICAL_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
DEDUP_MARGIN = 0.1  # tau_same sits this far above the most similar calibration near-miss


def load_fixture(path: Path = FIXTURE) -> dict[str, Any]:
    return json.loads(path.read_text())


@dataclass
class Query:
    text: str
    family: int | None  # None: off-topic, the right answer is nothing
    split: str


def queries_of(fixture: dict[str, Any]) -> list[Query]:
    out = [Query(q, i, f["split"]) for i, f in enumerate(fixture["families"]) for q in f["paraphrases"]]
    return out + [Query(o["query"], None, o["split"]) for o in fixture["off_topic"]]


def build_index(fixture: dict[str, Any], embedder: Embedder) -> tuple[WorkspaceIndex, list[int | None]]:
    """The fixture pool in the service's own index; returns it and the family of every row."""
    items: list[tuple[int | None, dict]] = []
    for i, family in enumerate(fixture["families"]):
        items.append((i, family["experience"]))
        items.extend((None, d) for d in family["distractors"])
    vectors = embedder.encode([item["when_to_use"] for _, item in items])
    index = WorkspaceIndex("quality", embedder.dimension)
    for row, ((_, item), vector) in enumerate(zip(items, vectors, strict=True)):
        digest = content_hash(item["when_to_use"], item["content"])
        index.put(Experience(experience_id=f"row{row}", when_to_use=item["when_to_use"], content=item["content"],
                             content_hash=digest), vector)
    return index, [family for family, _ in items]


def _metrics(relevance: np.ndarray, queries: list[Query], families: list[int | None], threshold: float
             ) -> dict[str, float]:
    """Recall@1/@3 and MRR (a gold hit counts only at or above the threshold) and off-topic abstention."""
    hits1 = hits3 = rr = 0.0
    in_domain = abstained = off_topic = 0
    for row, query in zip(relevance, queries, strict=True):
        order = np.argsort(-row, kind="stable")
        if query.family is None:
            off_topic += 1
            abstained += int(row[order[0]] < threshold)
            continue
        in_domain += 1
        for rank, col in enumerate(order[:10]):
            if families[col] == query.family and row[col] >= threshold:
                hits1 += rank < 1
                hits3 += rank < 3
                rr += 1.0 / (rank + 1)
                break
    return {"recall@1": hits1 / in_domain, "recall@3": hits3 / in_domain, "mrr": rr / in_domain,
            "abstention": abstained / off_topic, "n_queries": in_domain, "n_off_topic": off_topic}


def _calibrate_threshold(relevance: np.ndarray, queries: list[Query], families: list[int | None],
                         grid: np.ndarray) -> tuple[float, float]:
    """The threshold maximising recall@3 + abstention; the middle of the best plateau (robust to drift)."""
    scores = [(_metrics(relevance, queries, families, t)) for t in grid]
    objective = np.array([s["recall@3"] + s["abstention"] for s in scores])
    best = np.flatnonzero(objective >= objective.max() - 1e-9)
    return float(grid[best[len(best) // 2]]), float(objective.max())


def run(embedder: Embedder | None = None, fixture: dict[str, Any] | None = None) -> dict[str, Any]:
    embedder = embedder or shared_embedder()
    fixture = fixture or load_fixture()
    index, families = build_index(fixture, embedder)
    queries = queries_of(fixture)
    n = len(families)
    query_vectors = embedder.encode([q.text for q in queries])
    dense = query_vectors @ index.vectors[:n].T
    lexical = np.stack([index.lexical.saturated(q.text, n) for q in queries])
    bm25 = np.stack([index.lexical.scores(q.text, n) for q in queries])
    cal = [i for i, q in enumerate(queries) if q.split == "calibration"]
    test = [i for i, q in enumerate(queries) if q.split == "test"]
    cal_q, test_q = [queries[i] for i in cal], [queries[i] for i in test]

    # Hybrid: pick the lexical weight and the threshold together on the calibration half.
    best: tuple[float, float, float] | None = None  # (objective, weight, threshold)
    for weight in LEXICAL_WEIGHTS:
        threshold, objective = _calibrate_threshold((dense + weight * lexical)[cal], cal_q, families, THRESHOLD_GRID)
        if best is None or objective > best[0] + 1e-9:
            best = (objective, weight, threshold)
    assert best is not None
    _, weight, threshold = best
    dense_threshold, _ = _calibrate_threshold(dense[cal], cal_q, families, THRESHOLD_GRID)
    bm25_grid = np.round(np.arange(0.0, float(bm25.max()) + 0.5, 0.05), 2)
    bm25_threshold, _ = _calibrate_threshold(bm25[cal], cal_q, families, bm25_grid)

    # The service's own search must agree with the matrix evaluation above.
    for i in test:
        hits = index.search(query_vectors[i], queries[i].text, top_k=3, min_relevance=threshold,
                            lexical_weight=weight, utility_weight=0.1, candidate_factor=3)
        row = dense[i] + weight * lexical[i]
        expected = [f"row{c}" for c in np.argsort(-row, kind="stable")[:3] if row[c] >= threshold]
        got = [h.experience.experience_id for h in hits]
        if got != expected:
            raise AssertionError(f"index search {got} disagrees with the evaluation {expected} for {queries[i].text!r}")

    dedup = _dedup_calibration(fixture, embedder)
    return {
        "fixture": {"families": len(fixture["families"]), "pool": n, "queries": len(queries)},
        "calibrated": {"min_similarity": threshold, "lexical_weight": weight,
                       "dedup_same_threshold": dedup["same_threshold"],
                       "dedup_merge_threshold": dedup["merge_threshold"]},
        "test": {
            "hybrid": _metrics((dense + weight * lexical)[test], test_q, families, threshold),
            "dense_only": {**_metrics(dense[test], test_q, families, dense_threshold), "threshold": dense_threshold},
            "bm25": {**_metrics(bm25[test], test_q, families, bm25_threshold), "threshold": bm25_threshold},
            "dedup": dedup["test"],
        },
        "calibration": {"hybrid": _metrics((dense + weight * lexical)[cal], cal_q, families, threshold)},
    }


def _dedup_calibration(fixture: dict[str, Any], embedder: Embedder) -> dict[str, Any]:
    """tau_same above every calibration near-miss (plus a margin); tau_merge below every true duplicate."""
    pairs: dict[str, list[tuple[str, str, bool]]] = {"calibration": [], "test": []}
    families = fixture["families"]
    for f in families:
        gold = f["experience"]["when_to_use"]
        pairs[f["split"]] += [(gold, d, True) for d in f["duplicates"]]
        pairs[f["split"]] += [(gold, d["when_to_use"], False) for d in f["distractors"]]
        pairs[f["split"]] += [(gold, g["experience"]["when_to_use"], False) for g in families
                              if g["split"] == f["split"] and g is not f]
    sims: dict[str, list[tuple[float, bool]]] = {}
    for split, items in pairs.items():
        a = embedder.encode([x for x, _, _ in items])
        b = embedder.encode([y for _, y, _ in items])
        sims[split] = [(float(s), same) for s, (_, _, same) in zip((a * b).sum(1), items, strict=True)]
    negatives = [s for s, same in sims["calibration"] if not same]
    positives = [s for s, same in sims["calibration"] if same]
    same_threshold = min(1.0, math.ceil((max(negatives) + DEDUP_MARGIN) * 100) / 100)
    merge_threshold = min(same_threshold, math.floor(min(positives) * 100) / 100)

    test = sims["test"]
    flagged = [same for s, same in test if s >= same_threshold]
    banded = [same for s, same in test if s >= merge_threshold]
    n_dups = sum(same for _, same in test)
    return {"same_threshold": same_threshold, "merge_threshold": merge_threshold, "test": {
        "duplicate_precision": (sum(flagged) / len(flagged)) if flagged else 1.0,
        "duplicate_recall": sum(flagged) / n_dups,
        "merge_band_recall": sum(banded) / n_dups,
        "near_miss_in_band": sum(1 for s, same in test if not same and merge_threshold <= s < same_threshold),
        "pairs": len(test)}}


if __name__ == "__main__":
    report = run()
    json.dump(report, sys.stdout, indent=2)
    print()
