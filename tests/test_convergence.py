"""Convergence on real data under horovodrun: scikit-learn's bundled digits, and a
smoke run of the language model on the standard library's sources.

Accuracy is the mean test accuracy of the last five epochs (the test split has
360 images, so one image is 0.28 points).
"""

import json
import math
import os
import sys

import numpy as np
import pytest

from launch import ROOT, horovodrun
from records import read_report

sys.path.insert(0, os.path.join(ROOT, "examples"))
EPOCHS = 20  # cosine schedule over 20 epochs; docs/ records the 40-epoch runs


def _train(size, methods, tmp_path, density=0.01):
    horovodrun(size, "tests/workers/convergence.py", tmp_path, density, EPOCHS, ",".join(methods),
               timeout=900)
    return {r["method"]: r for r in read_report(tmp_path, 0)["results"]}


def _final(result):
    return float(np.mean(result["accuracies"][-5:]))


@pytest.mark.horovod
def test_every_method_matches_dense_accuracy(tmp_path):
    """On 2 ranks (the 4-rank, 40-epoch runs are in docs/convergence_0.01.md):
    every method within 1.5 points of dense (5 of 360 test images), MiCRO's and
    ExDyna's density on target (mean error <= 2 %; max <= 10 %: on 2 ranks the
    5,000-step soak saw 9.6 %), gTop-k and CLT-k applying exactly k every step.
    Left to the 4-rank benchmark (docs/convergence_0.01.md), to keep make test
    short: hard threshold and gs-SGD (the slowest step); Random-k diverges on
    this task with error feedback (recorded there)."""
    partition, baselines = ["micro", "exdyna", "deft"], ["topk", "gtopk", "dgc", "cltk"]
    results = _train(2, ["dense"] + partition + baselines, tmp_path)
    dense = _final(results["dense"])
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


def test_language_model_corpus_is_split_by_file():
    import charlm
    assert not set(charlm.TRAIN_FILES) & set(charlm.VALIDATION_FILES)
    train, validation = charlm.read_corpus(charlm.TRAIN_FILES), charlm.read_corpus(
        charlm.VALIDATION_FILES)
    assert train.dtype == np.uint8 and len(train) > 500_000 and len(validation) > 20_000
    windows = charlm.validation_windows(validation)
    assert windows.shape == (charlm.VALIDATION_WINDOWS, charlm.VALIDATION_LENGTH + 1)
    assert np.array_equal(windows[0].numpy(), validation[:charlm.VALIDATION_LENGTH + 1])
    assert sum(p.numel() for p in charlm.CharLSTM().parameters()) == 1_331_456


def test_language_model_corpus_missing_file_is_a_clear_error(tmp_path):
    import charlm
    with pytest.raises(FileNotFoundError, match="standard library's source file"):
        charlm.read_corpus(("argparse.py",), directory=str(tmp_path))


@pytest.mark.horovod
def test_language_model_smoke(tmp_path):
    """A few ExDyna steps of examples/charlm.py on 2 ranks: the summary's shape,
    a validation curve that starts near log2(256) = 8 bits and falls, density on target."""
    out = tmp_path / "charlm.json"
    horovodrun(2, "examples/charlm.py", "--compression", "exdyna", "--density", 0.01,
               "--steps", 20, "--eval-every", 10, "--json", out)
    summary = json.loads(out.read_text())
    assert summary["ranks"] == 2 and summary["parameters"] == 1_331_456
    assert [p["step"] for p in summary["curve"]] == [0, 10, 20]
    seconds = [p["seconds"] for p in summary["curve"]]
    assert seconds[0] == 0 and seconds[0] < seconds[1] < seconds[2]
    bpc = [p["bpc"] for p in summary["curve"]]
    assert all(math.isfinite(b) for b in bpc) and abs(bpc[0] - 8) < 0.2 and bpc[-1] < bpc[0] - 1
    assert summary["disagreement"] == 0.0
    assert abs(summary["density"] - 0.01) < 0.002 and summary["bytes_per_step"] > 0
