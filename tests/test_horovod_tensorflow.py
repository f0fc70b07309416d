"""The TensorFlow adapter through Horovod's own TensorFlow classes on real ranks.

``hvd.DistributedGradientTape(..., groups=1)`` with horovod_sparse's
compressor, eagerly and inside ``tf.function``: every rank's aggregate,
residual, counts, thresholds and partitions equal the numpy reference bit for
bit (horovodrun, 2 and 4 ranks), and equal what the PyTorch adapter gives on
the same input.  Keras ``fit``, checkpoints and errors: ``tf_behaviour.py``.
"""

import json

import numpy as np
import pytest

from gradients import stream
from harness import CASES, check_rank_files
from launch import horovodrun
from records import assert_rank_checks, read_report

pytestmark = pytest.mark.horovod
STEPS, SEED, DENSITY = 12, 7, 0.02


def _tape(size, mode, out, cases, steps=STEPS):
    horovodrun(size, "tests/workers/tf_tape.py", "--out", out, "--cases", json.dumps(cases),
               "--mode", mode, "--steps", steps, "--seed", SEED, "--density", DENSITY)


def test_tape_in_tf_function_four_ranks_match_reference(tmp_path):
    _tape(4, "function", tmp_path, CASES)
    check_rank_files(tmp_path, CASES, stream(SEED, STEPS, 4), DENSITY)


def test_tape_eager_two_ranks_match_reference(tmp_path):
    _tape(2, "eager", tmp_path, CASES)
    check_rank_files(tmp_path, CASES, stream(SEED, STEPS, 2), DENSITY)


def test_tensorflow_equals_pytorch(tmp_path):
    cases = [["exdyna", {}], ["dgc", {}]]
    (tmp_path / "tf").mkdir()
    (tmp_path / "torch").mkdir()
    _tape(2, "function", tmp_path / "tf", cases, steps=5)
    horovodrun(2, "tests/workers/torch_exchange.py", "--out", tmp_path / "torch", "--cases",
               json.dumps(cases), "--steps", 5, "--seed", SEED, "--density", DENSITY)
    for index in range(len(cases)):
        for rank in range(2):
            tf_run = read_report(tmp_path / "tf", rank, f"case{index}")
            torch_run = read_report(tmp_path / "torch", rank, f"case{index}")
            for key in ("aggregate", "residual", "counts"):
                np.testing.assert_array_equal(tf_run[key], torch_run[key], f"{cases[index]} {key}")


@pytest.mark.parametrize("scenario, ranks", [("errors", 2), ("checkpoint", 2), ("keras", 2),
                                             ("user_script", 2), ("process_set", 3)])
def test_tensorflow_behaviour(scenario, ranks, tmp_path):
    """Each scenario's checks hold on every rank (see workers/tf_behaviour.py)."""
    horovodrun(ranks, "tests/workers/tf_behaviour.py", scenario, tmp_path)
    assert_rank_checks(tmp_path, ranks)
