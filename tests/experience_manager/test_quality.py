"""Retrieval quality on the fixture: thresholds from the calibration half, scores on the test half."""

from __future__ import annotations

import json

import pytest

from experience_manager import quality
from experience_manager.settings import DedupSettings, RetrievalSettings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report():
    return quality.run()


def test_shipped_defaults_are_the_calibrated_thresholds(report):
    calibrated = report["calibrated"]
    assert RetrievalSettings().min_similarity == pytest.approx(calibrated["min_similarity"], abs=0.015)
    assert RetrievalSettings().lexical_weight == pytest.approx(calibrated["lexical_weight"])
    assert DedupSettings().same_threshold == pytest.approx(calibrated["dedup_same_threshold"], abs=0.015)
    assert DedupSettings().merge_threshold == pytest.approx(calibrated["dedup_merge_threshold"], abs=0.015)


def test_held_out_recall_and_abstention_beside_bm25(report):
    test = report["test"]
    print("\nretrieval quality on the test half:", json.dumps({k: test[k] for k in ("hybrid", "dense_only", "bm25")}))
    assert report["fixture"]["families"] == 20 and test["hybrid"]["n_queries"] == 50
    assert test["hybrid"]["recall@3"] >= 0.9
    assert test["hybrid"]["abstention"] >= 0.8
    assert test["hybrid"]["recall@3"] >= test["bm25"]["recall@3"]
    # Dedup: nothing the calibration called a near miss is auto-merged on the test half.
    assert test["dedup"]["duplicate_precision"] == 1.0 and test["dedup"]["merge_band_recall"] == 1.0
