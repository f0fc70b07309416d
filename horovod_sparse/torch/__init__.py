"""PyTorch adapter: Horovod compressors backed by the framework-agnostic core,
the gossip optimizers (Crossover-SGD, SGP), and the compressor's handler for
``hvd.elastic.TorchState`` (registered on import)."""

from . import elastic
from .compression import Compression, SparseCompressor, check_parameters
from .gossip import SGP, CrossoverSGD

elastic.register()

__all__ = ["Compression", "CrossoverSGD", "SGP", "SparseCompressor", "check_parameters"]
