"""Bad input through Horovod's DistributedOptimizer on real ranks (horovodrun -np 2):
clear errors on every rank, never a hang, nothing lost."""

import json

import pytest

from launch import horovodrun

pytestmark = pytest.mark.horovod


def _results(scenario):
    out = horovodrun(2, "tests/workers/torch_reliability.py", scenario)
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    assert sorted(r["rank"] for r in rows) == [0, 1], out[-3000:]
    return rows


def test_half_bfloat16_strided_and_empty_gradients_average_exactly():
    for row in _results("dtypes"):
        assert row["averages_exact"], row  # dtype and shape kept, value = the dense average
        assert row["float16_on_the_wire"] is True, row
        assert row["passthrough"], row     # integer, boolean and empty tensors untouched
        assert row["float16_on_the_wire"] is True, row


def test_models_differing_across_ranks_raise_on_every_rank():
    for row in _results("mismatch"):
        assert row["raised"] == "ModelMismatchError" and "differs from rank" in row["message"]


def test_nan_on_one_rank_raises_on_every_rank_and_keeps_the_residual():
    for row in _results("raise"):
        assert row["seen"] == ["ok", "ok", "raised [1]", "residual kept"], row
        assert row["finite"]


def test_skip_policy_skips_the_step_on_every_rank_and_training_continues():
    for row in _results("skip"):
        assert row["seen"] == ["ok", "ok", "skipped", "ok"], row
        assert row["finite"]


def test_consistency_guard_names_the_first_differing_tensor_on_every_rank():
    for row in _results("diverge"):
        assert row["name"] == "layer.bias" and row["ranks"] == [1] and row["step"] == 2, row
