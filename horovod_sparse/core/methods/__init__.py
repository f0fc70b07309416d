"""Sparsification methods, one module each."""

from .cltk import CLTK
from .deft import DEFT
from .dgc import DGC
from .exclusive import ExDyna, MiCRO
from .gssgd import GsSGD
from .gtopk import GTopK
from .hard_threshold import HardThreshold
from .randomk import RandomK
from .topk import TopK

__all__ = ["CLTK", "DEFT", "DGC", "ExDyna", "GTopK", "GsSGD", "HardThreshold", "MiCRO", "RandomK",
           "TopK"]
