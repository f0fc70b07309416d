"""A rank killed mid-training (SIGKILL) ends the whole job, non-zero, in bounded time."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from launch import BIN, ROOT, env

pytestmark = pytest.mark.horovod
BOUND_S = 60


def _killed_job(command, tmp_path):
    """Run ``command``; return (exit code, seconds from the kill to the launcher's exit)."""
    started = time.time()
    try:
        result = subprocess.run(command, cwd=ROOT, env=env(), capture_output=True, text=True,
                                timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job hung after a rank was killed: {' '.join(command)}")
    ended = time.time()
    killed_at = float((tmp_path / "killed").read_text())
    assert started < killed_at < ended
    return result.returncode, ended - killed_at, result


def test_horovodrun_ends_when_a_rank_is_killed(tmp_path):
    command = [os.path.join(BIN, "horovodrun"), "-np", "3", "-H", "localhost:3", "--gloo",
               sys.executable, "tests/workers/rank_failure.py", str(tmp_path), "20", "1"]
    code, seconds, result = _killed_job(command, tmp_path)
    print(f"horovodrun: exit {code}, {seconds:.1f} s after the kill")
    assert code != 0 and seconds < BOUND_S, (code, seconds, result.stderr[-2000:])


def test_mpirun_ends_when_a_rank_is_killed(tmp_path):
    command = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe",
               "-np", "3", "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH", "--mca", "btl",
               "self,tcp,vader", sys.executable, "tests/workers/rank_failure.py", str(tmp_path),
               "20", "2"]
    code, seconds, result = _killed_job(command, tmp_path)
    print(f"mpirun: exit {code}, {seconds:.1f} s after the kill")
    assert code != 0 and seconds < BOUND_S, (code, seconds, result.stderr[-2000:])
