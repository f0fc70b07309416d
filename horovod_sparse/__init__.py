"""horovod_sparse: sparse gradient exchange for Horovod.

Pass ``horovod_sparse.torch.Compression.exdyna(density=0.001)`` (or ``topk``,
``micro``, ``deft``) as ``compression=`` to ``hvd.DistributedOptimizer``.
The framework-agnostic core is importable without torch, tensorflow or Horovod.
"""

from .core import available, create

__version__ = "0.1.0"
__all__ = ["available", "create", "__version__"]
