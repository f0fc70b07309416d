"""Convergence on real data (scikit-learn's bundled digits) under horovodrun.

Accuracy is the mean test accuracy of the last five epochs (the test split has
360 images, so one image is 0.28 points).
"""

import json

import numpy as np
import pytest

from launch import horovodrun

pytestmark = pytest.mark.horovod
EPOCHS = 20  # cosine schedule over 20 epochs; docs/ records the 40-epoch runs


def _train(size, methods, tmp_path, density=0.01):
    out = tmp_path / "results.json"
    horovodrun(size, "tests/workers/convergence.py", out, density, EPOCHS, ",".join(methods),
               timeout=900)
    return {r["method"]: r for r in json.loads(out.read_text())}


def _final(result):
    return float(np.mean(result["accuracies"][-5:]))


def test_every_method_matches_dense_accuracy(tmp_path):
    """On 2 ranks (the 4-rank, 40-epoch runs are in docs/convergence_0.01.md):
    every method within 1.5 points of dense (5 of 360 test images), MiCRO's and
    ExDyna's density on target (mean error <= 2 %; max <= 10 %: on 2 ranks the
    5,000-step soak saw 9.6 %), gTop-k and CLT-k applying exactly k every step.
    Left to the 4-rank benchmark (docs/convergence_0.01.md), to keep make test
    short: hard threshold and gs-SGD (the slowest step); Random-k diverges on
    this task with error feedback (recorded there)."""
    partition, baselines = ["micro", "exdyna", "deft"], ["topk", "gtopk", "dgc", "cltk"]
    results = _train(2, ["none"] + partition + baselines, tmp_path)
    dense = _final(results["none"])
    assert dense > 0.95
    for method in partition:
        assert _final(results[method]) >= dense - 0.015, (method, results[method]["accuracies"])
    for method in ("micro", "exdyna"):  # threshold-controlled density
        assert results[method]["density_error_mean"] <= 0.02, results[method]
        assert results[method]["density_error_max"] <= 0.10, results[method]
    for method in baselines:
        assert _final(results[method]) >= dense - 0.015, (method, results[method]["accuracies"])
    for method in ("gtopk", "cltk"):  # exactly k coordinates applied every step
        assert results[method]["density_error_max"] == 0.0, results[method]
