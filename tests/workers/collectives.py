"""Rank program: every Communicator collective on real ranks, checked against plain numpy.

argv: torch | tensorflow | mpi4py, out.  Every rank reports ``checks`` (``records.report``).
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from records import report  # noqa: E402


def communicator(kind):
    if kind == "torch":
        import horovod.torch as hvd
        import torch
        from horovod_sparse.torch.comm import HorovodTorchCommunicator
        hvd.init()
        return HorovodTorchCommunicator(), torch.from_numpy, lambda t: t.numpy()
    if kind == "tensorflow":
        import horovod.tensorflow as hvd
        import tensorflow as tf
        from horovod_sparse.tensorflow.comm import HorovodTensorFlowCommunicator
        hvd.init()
        return HorovodTensorFlowCommunicator(), tf.constant, lambda t: t.numpy()
    from horovod_sparse.mpi import MpiCommunicator
    return MpiCommunicator(), np.asarray, np.asarray


def vector(rank, length):
    return np.arange(length, dtype=np.float32) + 100 * rank


def main():
    comm, wrap, unwrap = communicator(sys.argv[1])
    rank, size = comm.rank, comm.size
    counts = [r + 1 for r in range(size)]  # variable lengths, rank 0 sends one element
    gathered = unwrap(comm.allgather(wrap(vector(rank, counts[rank])), counts))
    expected = np.concatenate([vector(r, counts[r]) for r in range(size)])
    checks = {"allgather": np.array_equal(gathered, expected)}
    summed = unwrap(comm.allreduce_sum(wrap(vector(rank, 5))))
    checks["allreduce"] = np.array_equal(summed, sum(vector(r, 5) for r in range(size)))
    root = size - 1
    checks["broadcast"] = np.array_equal(unwrap(comm.broadcast(wrap(vector(rank, 4), ), root)),
                                         vector(root, 4))
    # rank r sends (j + r) % 3 elements to rank j
    splits = [(j + rank) % 3 for j in range(size)]
    received, received_splits = comm.alltoall(wrap(vector(rank, sum(splits))), splits)
    parts = []
    for j in range(size):
        their = [(i + j) % 3 for i in range(size)]
        start = sum(their[:rank])
        parts.append(vector(j, sum(their))[start:start + their[rank]])
    checks["alltoall"] = (np.array_equal(unwrap(received), np.concatenate(parts))
                          and received_splits == [len(p) for p in parts])
    table = comm.allgather_host(np.array([rank, 7], dtype=np.int64))
    checks["allgather_host"] = table.tolist() == [[r, 7] for r in range(size)]
    checks["broadcast_host"] = comm.broadcast_host(np.array([rank], dtype=np.int64), 0).tolist() == [0]
    if sys.argv[1] == "torch":
        checks["waits_without_spinning"] = waits_without_spinning(comm, wrap)
    report(sys.argv[2], rank, checks={k: bool(v) for k, v in checks.items()})


def waits_without_spinning(comm, wrap, late=1.0):
    """The last rank joins an allreduce ``late`` seconds after the others: they wait
    sleeping (Horovod's ``hvd.synchronize`` would spin a core each).  Over Gloo
    only: an MPI library's collective may spin in Horovod's background thread."""
    import horovod.torch as hvd
    if comm.rank == comm.size - 1:
        time.sleep(late)
    cpu = time.process_time()  # every thread of this process
    comm.allreduce_sum(wrap(np.ones(1, dtype=np.float32)))
    spent = time.process_time() - cpu
    return hvd.mpi_enabled() or comm.rank == comm.size - 1 or spent < late / 2


if __name__ == "__main__":
    main()
