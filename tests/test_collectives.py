"""Every Communicator collective, on real ranks, for each backend."""

import numpy as np
import pytest

from horovod_sparse.core import run_simulated
from launch import horovodrun, mpirun
from records import assert_rank_checks


@pytest.mark.horovod
@pytest.mark.parametrize("launcher,size,backend", [
    (horovodrun, 3, "torch"),       # Horovod over Gloo
    (mpirun, 3, "torch"),           # Horovod over MPI
    (horovodrun, 2, "tensorflow"),
    (mpirun, 3, "mpi4py"),
], ids=["torch-gloo", "torch-mpi", "tensorflow-gloo", "mpi4py"])
def test_collectives_on_real_ranks(launcher, size, backend, tmp_path):
    launcher(size, "tests/workers/collectives.py", backend, tmp_path)
    assert_rank_checks(tmp_path, size)


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
