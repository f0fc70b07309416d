"""Sparsification methods, one module each."""

from .deft import DEFT
from .exclusive import ExDyna, MiCRO
from .topk import TopK

__all__ = ["DEFT", "ExDyna", "MiCRO", "TopK"]
