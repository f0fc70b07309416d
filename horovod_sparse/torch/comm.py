"""``Communicator`` over Horovod's PyTorch collectives (Gloo or MPI, CPU or GPU)."""

import time

import horovod.torch as hvd
import torch

from ..core.comm import ProcessSetCommunicator


class HorovodTorchCommunicator(ProcessSetCommunicator):
    """Collectives of ``process_set`` (default: all ranks) through ``horovod.torch``."""

    def __init__(self, process_set=None):
        super().__init__(process_set if process_set is not None else hvd.global_process_set)

    def _numel(self, x):
        return x.numel()

    def _itemsize(self, x):
        return x.element_size()

    def _allgather(self, x, counts):
        return hvd.allgather(x, name=self._name(), process_set=self.process_set)

    def _allreduce_sum(self, x):
        return hvd.allreduce(x, op=hvd.Sum, name=self._name(), process_set=self.process_set)

    def _broadcast(self, x, root):
        return hvd.broadcast(x, self.global_rank(root), name=self._name(),
                             process_set=self.process_set)

    def _alltoall(self, x, splits):
        received, received_splits = hvd.alltoall(
            x, splits=torch.tensor(splits, dtype=torch.int32), name=self._name(),
            process_set=self.process_set)
        return received, received_splits.tolist()

    def _allgather_host(self, array):
        gathered = hvd.allgather(torch.from_numpy(array[None]), name=self._name(),
                                 process_set=self.process_set)
        return gathered.numpy()

    def _allgather_host_within(self, array, timeout):
        handle = hvd.allgather_async(torch.from_numpy(array[None]), name=self._name(),
                                     process_set=self.process_set)
        deadline = time.monotonic() + timeout
        while not hvd.poll(handle):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank {self.rank} waited {timeout:g} s for the other ranks in a collective "
                    "call")
            time.sleep(0.001)
        return hvd.synchronize(handle).numpy()

    def _broadcast_host(self, array, root):
        return hvd.broadcast(torch.from_numpy(array), self.global_rank(root), name=self._name(),
                             process_set=self.process_set).numpy()

    def _allreduce_host(self, array):
        return hvd.allreduce(torch.from_numpy(array), op=hvd.Sum, name=self._name(),
                             process_set=self.process_set).numpy()
