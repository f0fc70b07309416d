"""PyTorch adapter: Horovod compressors backed by the framework-agnostic core,
and the gossip optimizers (Crossover-SGD, SGP)."""

from .compression import Compression, SparseCompressor, check_parameters
from .gossip import SGP, CrossoverSGD

__all__ = ["Compression", "CrossoverSGD", "SGP", "SparseCompressor", "check_parameters"]
