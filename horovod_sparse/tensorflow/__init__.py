"""TensorFlow adapter: Horovod compressors backed by the framework-agnostic core
(``Compression.exdyna(...)`` for ``hvd.DistributedGradientTape(..., groups=1)``
and Horovod's Keras ``DistributedOptimizer``), plus the core's TensorFlow
array operations and Horovod communicator."""

from .comm import HorovodTensorFlowCommunicator
from .compression import Compression, SparseCompressor, check_parameters
from .ops import TensorFlowOps

__all__ = ["Compression", "HorovodTensorFlowCommunicator", "SparseCompressor", "TensorFlowOps",
           "check_parameters"]
