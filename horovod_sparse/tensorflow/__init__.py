"""TensorFlow pieces over the framework-agnostic core: array operations and a
Horovod communicator, so the core runs on TensorFlow tensors under Horovod."""

from .comm import HorovodTensorFlowCommunicator
from .ops import TensorFlowOps

__all__ = ["HorovodTensorFlowCommunicator", "TensorFlowOps"]
