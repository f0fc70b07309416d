"""Checkpoint and resume through Horovod's DistributedOptimizer (PyTorch).

On the same number of ranks, resuming reproduces the uninterrupted run bit
for bit, from per-rank compressor files and from one file rank 0 writes with
every rank's state; on another number of ranks (2 -> 3), every rank starts
from the mean of the old ranks' residuals and velocities (the pending update
is unchanged) and training goes on.  See ``workers/torch_resume.py``.
"""

import pytest

from launch import horovodrun
from records import assert_rank_checks

pytestmark = pytest.mark.horovod
WORKER = "tests/workers/torch_resume.py"


def test_resume_same_and_other_rank_count(tmp_path):
    methods = "topk,micro,exdyna,deft,gtopk,dgc"
    horovodrun(2, WORKER, "resume", methods, tmp_path)
    assert_rank_checks(tmp_path, 2, "resume")
    horovodrun(3, WORKER, "carry-over", "exdyna,dgc", tmp_path)
    reports = assert_rank_checks(tmp_path, 3, "carry-over")
    assert any("velocities" in key for key in reports[0]["checks"]), "DGC's velocity carried too"
