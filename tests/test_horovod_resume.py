"""Checkpoint and resume through Horovod reproduce the uninterrupted run bit for bit."""

import json

import pytest

from launch import horovodrun

pytestmark = pytest.mark.horovod


@pytest.mark.parametrize("method", ["topk", "micro", "exdyna", "deft"])
def test_resume_is_bit_identical(method, tmp_path):
    out = horovodrun(2, "tests/workers/torch_resume.py", method, tmp_path / "checkpoint.pt")
    reports = [json.loads(line.split(">:", 1)[-1]) for line in out.splitlines()
               if "bit_identical" in line]
    assert len(reports) == 2 and all(r["bit_identical"] for r in reports), reports
    assert all(r["in_place_zeroing_identical"] for r in reports), reports
