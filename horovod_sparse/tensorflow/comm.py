"""``Communicator`` over Horovod's TensorFlow collectives (eager mode)."""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from ..core.comm import ProcessSetCommunicator


class HorovodTensorFlowCommunicator(ProcessSetCommunicator):
    """Collectives of ``process_set`` (default: all ranks) through ``horovod.tensorflow``."""

    def __init__(self, process_set=None):
        super().__init__(process_set if process_set is not None else hvd.global_process_set)

    def _numel(self, x):
        return int(tf.size(x))

    def _itemsize(self, x):
        return x.dtype.size

    def _allgather(self, x, counts):
        return hvd.allgather(tf.convert_to_tensor(x), name=self._name(),
                             process_set=self.process_set)

    def _allreduce_sum(self, x):
        return hvd.allreduce(tf.convert_to_tensor(x), op=hvd.Sum, name=self._name(),
                             process_set=self.process_set)

    def _broadcast(self, x, root):
        return hvd.broadcast(tf.convert_to_tensor(x), self.global_rank(root), name=self._name(),
                             process_set=self.process_set)

    def _alltoall(self, x, splits):
        received, received_splits = hvd.alltoall(
            tf.convert_to_tensor(x), splits=tf.constant(splits, dtype=tf.int32),
            name=self._name(), process_set=self.process_set)
        return received, received_splits.numpy().tolist()

    def _allgather_host(self, array):
        return hvd.allgather(tf.constant(array[None]), name=self._name(),
                             process_set=self.process_set).numpy()

    def _broadcast_host(self, array, root):
        return np.asarray(hvd.broadcast(tf.constant(array), self.global_rank(root), name=self._name(),
                                        process_set=self.process_set).numpy())

    def _allreduce_host(self, array):
        return np.asarray(self._allreduce_sum(tf.constant(array)).numpy())
