"""``Communicator`` over Horovod's PyTorch collectives (Gloo or MPI, CPU or GPU)."""

import horovod.torch as hvd
import torch

from ..core.comm import Communicator


class HorovodTorchCommunicator(Communicator):
    """Collectives of ``process_set`` (default: all ranks) through ``horovod.torch``.

    Operation names are ``horovod_sparse.<n>`` with ``n`` counting the calls
    since the last :meth:`reset_traffic` (one step), so the same position in
    every step reuses its name (Horovod's response cache) and ranks agree.
    """

    def __init__(self, process_set=None):
        super().__init__()
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.rank = self.process_set.rank()
        self.size = self.process_set.size()
        self._calls = 0

    def reset_traffic(self):
        self._calls = 0
        return super().reset_traffic()

    def _name(self):
        self._calls += 1
        return f"horovod_sparse.{self._calls}"

    def _numel(self, x):
        return x.numel()

    def _itemsize(self, x):
        return x.element_size()

    def _allgather(self, x, counts):
        return hvd.allgather(x, name=self._name(), process_set=self.process_set)

    def _allreduce_sum(self, x):
        return hvd.allreduce(x, op=hvd.Sum, name=self._name(), process_set=self.process_set)

    def _broadcast(self, x, root):
        return hvd.broadcast(x, root, name=self._name(), process_set=self.process_set)

    def _alltoall(self, x, splits):
        received, received_splits = hvd.alltoall(
            x, splits=torch.tensor(splits, dtype=torch.int32), name=self._name(),
            process_set=self.process_set)
        return received, received_splits.tolist()

    def _allgather_host(self, array):
        gathered = hvd.allgather(torch.from_numpy(array[None]), name=self._name(),
                                 process_set=self.process_set)
        return gathered.numpy()

    def _broadcast_host(self, array, root):
        return hvd.broadcast(torch.from_numpy(array), root, name=self._name(),
                             process_set=self.process_set).numpy()


