"""Every Communicator collective, on real ranks, for each backend."""

import json
import re

import numpy as np
import pytest

from horovod_sparse.core import run_simulated
from launch import horovodrun, mpirun


def _reports(out):
    """Every rank's JSON report; mpirun may run two ranks' lines together."""
    return [json.loads(report) for report in re.findall(r'\{"rank": \d+, "checks": \{[^}]*\}\}', out)]


def _assert_all(out, size):
    reports = _reports(out)
    assert sorted(r["rank"] for r in reports) == list(range(size)), out
    for report in reports:
        assert all(report["checks"].values()), report


@pytest.mark.horovod
@pytest.mark.parametrize("launcher,size,backend", [
    (horovodrun, 3, "torch"),       # Horovod over Gloo
    (mpirun, 3, "torch"),           # Horovod over MPI
    (horovodrun, 2, "tensorflow"),
    (mpirun, 3, "mpi4py"),
], ids=["torch-gloo", "torch-mpi", "tensorflow-gloo", "mpi4py"])
def test_collectives_on_real_ranks(launcher, size, backend):
    _assert_all(launcher(size, "tests/workers/collectives.py", backend), size)


def test_simulated_alltoall_and_metering():
    def worker(comm):
        splits = [comm.rank + 1] * comm.size
        data = np.full(sum(splits), comm.rank, dtype=np.float32)
        received, received_splits = comm.alltoall(data, splits)
        return received.tolist(), received_splits, comm.traffic.totals()

    results = run_simulated(3, worker)
    assert results[0][0] == [0.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert results[2][1] == [1, 2, 3]
    assert results[1][2]["elements_sent"] == 4 and results[1][2]["bytes_received"] == 16
