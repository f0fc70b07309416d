"""Launch real multi-rank jobs from tests: ``horovodrun`` (Gloo) and ``mpirun`` (MPI)."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def env():
    """The environment of a test's jobs: one thread, unbuffered, the checkout importable."""
    variables = dict(os.environ)
    variables.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                     PYTHONPATH=os.pathsep.join(filter(None, [ROOT, variables.get("PYTHONPATH")])))
    return variables


def run(command, timeout):
    """``command`` from the checkout, with the test environment; its stdout, or AssertionError."""
    try:
        result = subprocess.run(command, cwd=ROOT, env=env(), capture_output=True, text=True,
                                timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"{' '.join(command)} did not finish in {timeout}s (deadlock?)\n"
                             f"{error.stdout or ''}\n{error.stderr or ''}") from None
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}\n"
                             f"--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}")
    return result.stdout


def horovodrun(np_, script, *args, timeout=300, testbed=None):
    """Run ``script`` on ``np_`` ranks with Horovod's Gloo controller: local ranks,
    or across the hosts of ``testbed`` (``benchmarks/testbed.py``)."""
    hosts = ["-H", f"localhost:{np_}"] if testbed is None else testbed.horovodrun_args(np_ // 2)
    command = [os.path.join(BIN, "horovodrun"), "-np", str(np_), *hosts, "--gloo",
               sys.executable, script, *map(str, args)]
    return run(command if testbed is None else testbed.on_host1(command), timeout)


def mpirun(np_, script, *args, timeout=300, testbed=None):
    """Run ``script`` on ``np_`` ranks under Open MPI (Horovod's MPI controller): local
    ranks, or across the hosts of ``testbed``."""
    hosts = [] if testbed is None else testbed.mpirun_args(np_ // 2)
    command = [shutil.which("mpirun") or "mpirun", "--allow-run-as-root", "--oversubscribe",
               "-np", str(np_), *hosts, "-x", "OMP_NUM_THREADS", "-x", "PYTHONPATH",
               "-x", "PYTHONUNBUFFERED", "-x", "TF_CPP_MIN_LOG_LEVEL", "--mca", "btl",
               "self,tcp,vader", sys.executable, script, *map(str, args)]
    return run(command if testbed is None else testbed.on_host1(command), timeout)

