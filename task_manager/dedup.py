"""Near-duplicate and contamination checks for new tasks.

A new task is a duplicate when it has the same reference operation sequence (signature), the
same goal (same seed task and same reference end state), the same normalized text, or a MiniLM
cosine at or above the threshold *with the same literal values* and no proof that the two differ.
The literal rule matters: two template queries "book flight FL12 for P3" and "book flight FL40
for P3" are ~0.97 cosine yet different tasks; a paraphrase of one task keeps its ids, numbers and
dates. The proof is the verified end state: two tasks whose references end in different states
are different tasks however alike they read ("book FL12 for P3" and "book FL12 for P3, then
cancel it"). The same cosine rule, with its own threshold, drops tasks that copy a held-out
evaluation task (contamination).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field, replace

import numpy as np

_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")
# Tokens that carry a task's specifics: anything with a digit (ids, dates, prices), codes in capitals
# (SFO, JFK), and quoted strings.
_LITERAL = re.compile(r"'[^']{1,80}'|\"[^\"]{1,80}\"|\b[\w\-:./]*\d[\w\-:./]*\b|\b[A-Z]{2,}\b")


def normalize_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text or "").lower()
    return _SPACE.sub(" ", _PUNCT.sub(" ", text)).strip()


def literal_values(text: str) -> frozenset[str]:
    return frozenset(m.strip("'\"").lower() for m in _LITERAL.findall(text or ""))


@dataclass
class DedupIndex:
    """What new tasks of one environment are compared with; grows as tasks are accepted."""

    threshold: float = 0.95
    contamination_threshold: float = 0.9
    signatures: set[str] = field(default_factory=set)
    goals: set[str] = field(default_factory=set)
    texts: set[str] = field(default_factory=set)
    queries: list[str] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 384), dtype=np.float32))
    end_states: list[str | None] = field(default_factory=list)  # per embedded query: its end-state hash
    heldout_texts: set[str] = field(default_factory=set)
    heldout_queries: list[str] = field(default_factory=list)
    heldout_vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 384), dtype=np.float32))

    def duplicate_reason(self, query: str, signature: str, goal_key: str | None,
                         vector: np.ndarray | None, end_state: str | None = None) -> str | None:
        """Why this task must be dropped, or None to keep it."""
        if signature in self.signatures:
            return "same_reference"
        if goal_key and goal_key in self.goals:
            return "same_goal"
        text = normalize_text(query)
        if text in self.heldout_texts:
            return "contaminated"
        if text in self.texts:
            return "same_text"
        if vector is not None:
            literals = literal_values(query)
            if _near(vector, literals, self.heldout_vectors, self.heldout_queries, [None] * len(self.heldout_queries),
                     self.contamination_threshold, None):
                return "contaminated"
            if _near(vector, literals, self.vectors, self.queries, self.end_states, self.threshold, end_state):
                return "near_duplicate"
        return None

    def add(self, query: str, signature: str, goal_key: str | None, vector: np.ndarray | None,
            end_state: str | None = None) -> None:
        self.signatures.add(signature)
        if goal_key:
            self.goals.add(goal_key)
        self.texts.add(normalize_text(query))
        if vector is not None:
            self.queries.append(query)
            self.end_states.append(end_state)
            self.vectors = np.vstack([self.vectors, vector[None, :].astype(np.float32)])

    def snapshot(self) -> DedupIndex:
        """A copy to go back to when what was added after it is not committed (`vectors` is replaced on each
        add, never changed in place, so it is shared)."""
        return replace(self, signatures=set(self.signatures), goals=set(self.goals), texts=set(self.texts),
                       queries=list(self.queries), end_states=list(self.end_states))

    def restore(self, snapshot: DedupIndex) -> None:
        self.__dict__.update(snapshot.__dict__)

    def set_heldout(self, queries: list[str], vectors: np.ndarray) -> None:
        self.heldout_texts = {normalize_text(q) for q in queries}
        self.heldout_queries = list(queries)
        self.heldout_vectors = vectors.astype(np.float32) if len(queries) else np.zeros((0, 384), np.float32)


def _near(vector: np.ndarray, literals: frozenset[str], matrix: np.ndarray, queries: list[str],
          end_states: list[str | None], threshold: float, end_state: str | None) -> bool:
    if not len(queries):
        return False
    similarities = matrix @ vector
    for i in np.nonzero(similarities >= threshold)[0]:
        other = end_states[int(i)]
        if end_state is not None and other is not None and other != end_state:
            continue  # verified to end in different states: different tasks
        if literal_values(queries[int(i)]) == literals:
            return True
    return False
