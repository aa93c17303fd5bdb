"""MiniLM embeddings from the installed package, offline."""

import numpy as np

from common.embeddings import DIMENSION, Embedder


def test_minilm_embeds_offline_and_caches():
    emb = Embedder(cache_size=8)
    vecs = emb.encode(["book a flight to Paris", "reserve a plane ticket to Paris", "how to bake bread"])
    assert vecs.shape == (3, DIMENSION) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2] + 0.2  # paraphrases are closer than unrelated text
    again = emb.encode(["reserve a plane ticket to Paris"])
    assert np.array_equal(again[0], vecs[1])
    assert emb.encode([]).shape == (0, DIMENSION)


def test_environment_service_import_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, common.embeddings, common.service, common.schemas; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
