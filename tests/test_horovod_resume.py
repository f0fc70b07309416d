"""Checkpoint and resume through Horovod's DistributedOptimizer (PyTorch).

On the same number of ranks, resuming reproduces the uninterrupted run bit
for bit, from per-rank compressor files and from one file rank 0 writes with
every rank's state; on another number of ranks (2 -> 3), every rank starts
from the mean of the old ranks' residuals and velocities (the pending update
is unchanged) and training goes on.  See ``workers/torch_resume.py``.
"""

import json

import pytest

from launch import horovodrun

pytestmark = pytest.mark.horovod
WORKER = "tests/workers/torch_resume.py"


def _assert_all_true(output, size):
    reports = [json.loads(line[line.index("{"):]) for line in output.splitlines()
               if '"checks"' in line]
    assert sorted(report["rank"] for report in reports) == list(range(size)), output
    for report in reports:
        failed = {key: value for key, value in report["checks"].items() if value is not True}
        assert not failed, f"rank {report['rank']}: {failed}"
    return reports


def test_resume_same_and_other_rank_count(tmp_path):
    methods = "topk,micro,exdyna,deft,gtopk,dgc"
    _assert_all_true(horovodrun(2, WORKER, "resume", methods, tmp_path), 2)
    reports = _assert_all_true(horovodrun(3, WORKER, "carry-over", "exdyna,dgc", tmp_path), 3)
    assert any("velocities" in key for key in reports[0]["checks"]), "DGC's velocity carried too"
