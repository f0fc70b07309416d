"""PyTorch adapter: Horovod compressors backed by the framework-agnostic core,
the gossip optimizers (Crossover-SGD, SGP), DGC's optimizer (``DGCSGD``:
weight decay under momentum), and the compressor's handler for
``hvd.elastic.TorchState`` (registered on import)."""

from . import elastic
from .compression import Compression, SparseCompressor, check_parameters
from .gossip import SGP, CrossoverSGD
from .optim import DGCSGD

elastic.register()

__all__ = ["Compression", "CrossoverSGD", "DGCSGD", "SGP", "SparseCompressor",
           "check_parameters"]
