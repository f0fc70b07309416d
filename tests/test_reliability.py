"""Bad input through Horovod's DistributedOptimizer on real ranks (horovodrun -np 2):
clear errors on every rank, never a hang, nothing lost."""

import pytest

from launch import horovodrun
from records import read_reports

pytestmark = pytest.mark.horovod


def _results(scenario, out):
    """What each of 2 ranks observed in ``scenario`` (``workers/torch_reliability.py``)."""
    horovodrun(2, "tests/workers/torch_reliability.py", scenario, out)
    return read_reports(out, 2)


def test_half_bfloat16_strided_and_empty_gradients_average_exactly(tmp_path):
    for row in _results("dtypes", tmp_path):
        assert row["averages_exact"], row  # dtype and shape kept, value = the dense average
        assert row["float16_on_the_wire"] is True, row
        assert row["passthrough"], row     # integer, boolean and empty tensors untouched


def test_models_differing_across_ranks_raise_on_every_rank(tmp_path):
    for row in _results("mismatch", tmp_path):
        assert row["raised"] == "ModelMismatchError" and "differs from rank" in row["message"]


def test_nan_on_one_rank_raises_on_every_rank_and_keeps_the_residual(tmp_path):
    for row in _results("raise", tmp_path):
        assert row["seen"] == ["ok", "ok", "raised [1]", "residual kept"], row
        assert row["finite"]


def test_skip_policy_skips_the_step_on_every_rank_and_training_continues(tmp_path):
    for row in _results("skip", tmp_path):
        assert row["seen"] == ["ok", "ok", "skipped", "ok"], row
        assert row["finite"]


def test_consistency_guard_names_the_first_differing_tensor_on_every_rank(tmp_path):
    for row in _results("diverge", tmp_path):
        assert row["name"] == "layer.bias" and row["ranks"] == [1] and row["step"] == 2, row
