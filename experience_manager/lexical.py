"""An incremental BM25 index over row numbers: the lexical half of hybrid retrieval, and the baseline.

MiniLM alone misses paraphrases whose specifics dominate the sentence ("email my manager that I'll
be late"); a saturated BM25 bonus on the shared keywords recovers them (calibrated in quality.py).
"""

from __future__ import annotations

import math

import numpy as np

from experience_manager.text import lexical_tokens

SATURATION = 5.0  # bm25 / (bm25 + SATURATION) maps a raw score into [0, 1)


class BM25Index:
    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[int, int]] = {}
        self._doc_terms: dict[int, dict[str, int]] = {}
        self._total_len = 0
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lengths = np.zeros(0, dtype=np.float32)

    def __len__(self) -> int:
        return len(self._doc_terms)

    def set(self, row: int, text: str) -> None:
        """Index (or re-index) the document at `row`."""
        self.remove(row)
        counts: dict[str, int] = {}
        for token in lexical_tokens(text):
            counts[token] = counts.get(token, 0) + 1
        self._doc_terms[row] = counts
        for token, tf in counts.items():
            self._postings.setdefault(token, {})[row] = tf
            self._arrays.pop(token, None)
        length = sum(counts.values())
        self._total_len += length
        if row >= len(self._lengths):
            grown = np.zeros(max(row + 1, 2 * len(self._lengths), 64), dtype=np.float32)
            grown[: len(self._lengths)] = self._lengths
            self._lengths = grown
        self._lengths[row] = length

    def remove(self, row: int) -> None:
        counts = self._doc_terms.pop(row, None)
        if counts is None:
            return
        for token in counts:
            posting = self._postings.get(token)
            if posting is not None:
                posting.pop(row, None)
                if not posting:
                    del self._postings[token]
            self._arrays.pop(token, None)
        self._total_len -= sum(counts.values())
        self._lengths[row] = 0

    def _term_arrays(self, token: str) -> tuple[np.ndarray, np.ndarray] | None:
        cached = self._arrays.get(token)
        if cached is None:
            posting = self._postings.get(token)
            if not posting:
                return None
            cached = (np.fromiter(posting.keys(), dtype=np.int64, count=len(posting)),
                      np.fromiter(posting.values(), dtype=np.float32, count=len(posting)))
            self._arrays[token] = cached
        return cached

    def scores(self, query: str, n_rows: int) -> np.ndarray:
        """Raw BM25 score of every row in [0, n_rows) for `query` (0 where no term matches)."""
        out = np.zeros(n_rows, dtype=np.float32)
        n_docs = len(self._doc_terms)
        if not n_docs:
            return out
        avg_len = max(self._total_len / n_docs, 1e-6)
        for token in set(lexical_tokens(query)):
            arrays = self._term_arrays(token)
            if arrays is None:
                continue
            rows, tfs = arrays
            keep = rows < n_rows
            rows, tfs = rows[keep], tfs[keep]
            df = len(self._postings[token])
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            norm = self.k1 * (1.0 - self.b + self.b * self._lengths[rows] / avg_len)
            out[rows] += idf * tfs * (self.k1 + 1.0) / (tfs + norm)
        return out

    def saturated(self, query: str, n_rows: int) -> np.ndarray:
        raw = self.scores(query, n_rows)
        return raw / (raw + SATURATION)
