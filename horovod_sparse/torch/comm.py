"""``Communicator`` over Horovod's PyTorch collectives (Gloo or MPI, CPU or GPU).

Every collective is started asynchronously and waited for by :func:`_wait`,
which polls with short sleeps: Horovod's own wait (``hvd.synchronize``) spins
on its core until the collective is done (measured: 2.3 s of CPU for a 2 s
wait on a late rank), and where ranks share cores -- two ranks on two here --
that spinning takes the core from the very rank the collective waits for.
"""

import time

import horovod.torch as hvd
import torch

from ..core.comm import ProcessSetCommunicator

POLL_SECONDS = 5e-5  # a sleep between polls: Linux wakes the thread 50-100 us later


def _wait(handle, timeout=None, rank=None):
    """``hvd.synchronize(handle)`` without spinning; with ``timeout`` (seconds),
    raise ``TimeoutError`` (naming ``rank``) if the other ranks have not joined by then."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not hvd.poll(handle):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"rank {rank} waited {timeout:g} s for the other ranks in a collective call")
        time.sleep(POLL_SECONDS)
    return hvd.synchronize(handle)


class HorovodTorchCommunicator(ProcessSetCommunicator):
    """Collectives of ``process_set`` (default: all ranks) through ``horovod.torch``."""

    def __init__(self, process_set=None):
        super().__init__(process_set if process_set is not None else hvd.global_process_set)

    def _numel(self, x):
        return x.numel()

    def _itemsize(self, x):
        return x.element_size()

    def _allgather(self, x, counts=None):
        return _wait(self._allgather_async(x))

    def _allgather_async(self, x):
        return hvd.allgather_async(x, name=self._name(), process_set=self.process_set)

    def _allreduce_sum(self, x):
        return _wait(hvd.allreduce_async(x, op=hvd.Sum, name=self._name(),
                                         process_set=self.process_set))

    def _broadcast(self, x, root):
        return _wait(hvd.broadcast_async(x, self.global_rank(root), name=self._name(),
                                         process_set=self.process_set))

    def _alltoall(self, x, splits):
        received, received_splits = _wait(hvd.alltoall_async(
            x, splits=torch.tensor(splits, dtype=torch.int32), name=self._name(),
            process_set=self.process_set))
        return received, received_splits.tolist()

    def _allgather_host(self, array):
        return self._allgather(torch.from_numpy(array[None])).numpy()

    def _allgather_host_within(self, array, timeout):
        return _wait(self._allgather_async(torch.from_numpy(array[None])), timeout,
                     self.rank).numpy()

    def _broadcast_host(self, array, root):
        return self._broadcast(torch.from_numpy(array), root).numpy()

    def _allreduce_host(self, array):
        return self._allreduce_sum(torch.from_numpy(array)).numpy()
