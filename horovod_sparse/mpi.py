"""``Communicator`` over mpi4py for numpy vectors (MPI benchmark scripts and tests).

Run under ``mpirun -np N``; reductions use ``MPI.SUM`` on the same buffers
on every rank, and Open MPI returns identical bits everywhere.
"""

import numpy as np
from mpi4py import MPI

from .core.comm import Communicator


class MpiCommunicator(Communicator):
    def __init__(self, comm=None):
        super().__init__()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def _allgather(self, x, counts):
        x = np.ascontiguousarray(x)
        if x.dtype == np.float16:  # MPI has no float16 type: move the bits
            return self._allgather(x.view(np.uint16), counts).view(np.float16)
        out = np.empty(sum(counts), dtype=x.dtype)
        self.comm.Allgatherv(x, [out, counts])
        return out

    def _allreduce_sum(self, x):
        x = np.ascontiguousarray(x)
        if x.dtype == np.float16:  # gather the bits, add in rank order (float16 sums)
            parts = self._allgather_host(x.view(np.uint16)).view(np.float16)
            total = parts[0].copy()
            for part in parts[1:]:
                total += part
            return total
        out = np.empty_like(x)
        self.comm.Allreduce(x, out, op=MPI.SUM)
        return out

    def _broadcast(self, x, root):
        out = np.array(x, copy=True)
        self.comm.Bcast(out, root=root)
        return out

    def _alltoall(self, x, splits):
        x = np.ascontiguousarray(x)
        received_splits = np.empty(self.size, dtype=np.int64)
        self.comm.Alltoall(np.asarray(splits, dtype=np.int64), received_splits)
        out = np.empty(int(received_splits.sum()), dtype=x.dtype)
        self.comm.Alltoallv([x, splits], [out, received_splits.tolist()])
        return out, received_splits.tolist()

    def _allgather_host(self, array):
        out = np.empty((self.size,) + array.shape, dtype=array.dtype)
        self.comm.Allgather(array, out)
        return out

    def _broadcast_host(self, array, root):
        return self._broadcast(array, root)

    def _allreduce_host(self, array):
        return self._allreduce_sum(array)
