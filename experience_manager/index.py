"""The in-memory view of one workspace: experiences, a numpy matrix of when_to_use vectors, BM25.

Qdrant is the store of record; this index is what retrieval reads, so a query is one matrix-vector
product (a few ms at 50k) instead of a Qdrant local-mode scan. It is only mutated from the event loop
thread, after the write it mirrors is durable.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import EllipsisType

import numpy as np

from common.schemas import Experience
from experience_manager.lexical import BM25Index


@dataclass
class Hit:
    experience: Experience
    similarity: float  # cosine(task, when_to_use)
    relevance: float  # similarity + lexical bonus: what min_similarity applies to
    score: float  # relevance + utility term: the ranking key


def lexical_document(experience: Experience) -> str:
    return f"{experience.when_to_use} {experience.content}"


def text_key(experience: Experience) -> tuple[str, str | None]:
    """What makes two experiences the same one: their text and the kind of task it was distilled from."""
    return experience.content_hash, experience.task_kind


class WorkspaceIndex:
    def __init__(self, workspace_id: str, dimension: int) -> None:
        self.workspace_id, self.dimension = workspace_id, dimension
        self.experiences: dict[str, Experience] = {}
        self.row_of: dict[str, int] = {}
        self.ids: list[str | None] = []
        # (content hash, task kind) -> id: the same text distilled from tasks of two kinds is two experiences
        self.by_text: dict[tuple[str, str | None], str] = {}
        self.vectors = np.zeros((64, dimension), dtype=np.float32)
        self.active = np.zeros(64, dtype=bool)
        self.utility = np.zeros(64, dtype=np.float32)
        self.lexical = BM25Index()
        self.version = 0  # bumped on every change that can alter a retrieval result

    # ------------------------------------------------------------ mutation

    def _grow(self, needed: int) -> None:
        if needed <= len(self.active):
            return
        capacity = max(needed, 2 * len(self.active))
        vectors = np.zeros((capacity, self.dimension), dtype=np.float32)
        vectors[: len(self.ids)] = self.vectors[: len(self.ids)]
        active = np.zeros(capacity, dtype=bool)
        active[: len(self.ids)] = self.active[: len(self.ids)]
        utility = np.zeros(capacity, dtype=np.float32)
        utility[: len(self.ids)] = self.utility[: len(self.ids)]
        self.vectors, self.active, self.utility = vectors, active, utility

    def put(self, experience: Experience, vector: np.ndarray | None) -> None:
        """Insert or replace an experience; `vector` may be None only when its text is unchanged."""
        eid = experience.experience_id
        row = self.row_of.get(eid)
        old = self.experiences.get(eid)
        if row is None:
            if vector is None:
                raise ValueError(f"experience {eid} is new to the index and needs a vector")
            row = len(self.ids)
            self._grow(row + 1)
            self.ids.append(eid)
            self.row_of[eid] = row
        if old is not None and self.by_text.get(text_key(old)) == eid:
            del self.by_text[text_key(old)]
        if vector is not None:
            self.vectors[row] = vector
        if old is None or old.when_to_use != experience.when_to_use or old.content != experience.content:
            self.lexical.set(row, lexical_document(experience))
        self.experiences[eid] = experience
        self.by_text[text_key(experience)] = eid
        self.active[row] = experience.status == "active"
        self.utility[row] = experience.usage.utility
        self.version += 1

    def delete(self, experience_id: str) -> None:
        row = self.row_of.pop(experience_id, None)
        old = self.experiences.pop(experience_id, None)
        if row is None or old is None:
            return
        self.ids[row] = None
        self.active[row] = False
        self.vectors[row] = 0.0
        self.lexical.remove(row)
        if self.by_text.get(text_key(old)) == experience_id:
            del self.by_text[text_key(old)]
        self.version += 1

    def vector_of(self, experience_id: str) -> np.ndarray:
        return self.vectors[self.row_of[experience_id]].copy()

    # ------------------------------------------------------------ queries

    @property
    def n_active(self) -> int:
        return int(self.active[: len(self.ids)].sum())

    def nearest(self, vector: np.ndarray, k: int = 3, *,
                task_kind: str | None | EllipsisType = ...) -> list[tuple[str, float]]:
        """The k stored experiences (active or archived) with the most similar when_to_use; with `task_kind`
        (None included), only those of that kind."""
        n = len(self.ids)
        if n == 0:
            return []
        sims = self.vectors[:n] @ vector
        alive = np.fromiter((i is not None and (task_kind is ... or self.experiences[i].task_kind == task_kind)
                             for i in self.ids), dtype=bool, count=n)
        sims[~alive] = -np.inf
        k = min(k, int(alive.sum()))
        if k <= 0:
            return []
        top = np.argpartition(-sims, k - 1)[:k]
        top = top[np.argsort(-sims[top])]
        return [(self.ids[i], float(sims[i])) for i in top]  # type: ignore[misc]

    def search(self, vector: np.ndarray, query: str, *, top_k: int, min_relevance: float, lexical_weight: float,
               utility_weight: float, candidate_factor: int, exclude: frozenset[str] = frozenset(),
               task_kind: str | None = None) -> list[Hit]:
        """The top_k hits by relevance and utility; with `task_kind`, the experiences of that kind first (a
        task is shown a demonstration of its own kind whenever the pool holds a relevant one)."""
        n = len(self.ids)
        if n == 0:
            return []
        sims = self.vectors[:n] @ vector
        relevance = sims + lexical_weight * self.lexical.saturated(query, n) if lexical_weight > 0 else sims.copy()
        relevance[~self.active[:n]] = -np.inf
        for eid in exclude:
            row = self.row_of.get(eid)
            if row is not None:
                relevance[row] = -np.inf
        n_candidates = min(top_k * candidate_factor, n)
        candidates = np.argpartition(-relevance, n_candidates - 1)[:n_candidates]
        if task_kind is not None:  # every experience of the kind is a candidate, however far down it ranks
            same = [row for row, eid in enumerate(self.ids) if eid is not None
                    and self.experiences[eid].task_kind == task_kind and np.isfinite(relevance[row])]
            candidates = np.union1d(candidates, np.asarray(same, dtype=candidates.dtype))
        candidates = candidates[relevance[candidates] >= min_relevance]
        if len(candidates) == 0:
            return []
        ranked = relevance[candidates] + utility_weight * (self.utility[candidates] - 0.5)
        if task_kind is None:
            order = candidates[np.argsort(-ranked, kind="stable")]
        else:
            other = np.fromiter((self.experiences[self.ids[row]].task_kind != task_kind  # type: ignore[index]
                                 for row in candidates), dtype=bool, count=len(candidates))
            order = candidates[np.lexsort((-ranked, other))]
        hits: list[Hit] = []
        seen_hashes: set[str] = set()
        for row in order:
            experience = self.experiences[self.ids[row]]  # type: ignore[index]
            if experience.content_hash in seen_hashes:
                continue
            seen_hashes.add(experience.content_hash)
            rel = float(relevance[row])
            hits.append(Hit(experience, float(sims[row]), rel, rel + utility_weight * (float(self.utility[row]) - 0.5)))
            if len(hits) == top_k:
                break
        return hits
