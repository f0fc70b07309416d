"""PyTorch adapter: Horovod compressors backed by the framework-agnostic core."""

from .compression import Compression, SparseCompressor

__all__ = ["Compression", "SparseCompressor"]
