"""Create sparsifiers by name: ``create("exdyna", density=0.001)``."""

import inspect

from . import methods  # noqa: F401  (imports every method module: each registers its class)
from .methods.base import REGISTRY as METHODS


def available():
    return sorted(METHODS)


def create(name, **hyperparameters):
    """Build the sparsifier ``name`` with its keyword hyper-parameters.

    Unknown names and unknown hyper-parameters raise with the valid choices.
    """
    if name not in METHODS:
        raise ValueError(f"unknown sparsification method {name!r}; known methods: {available()}")
    cls = METHODS[name]
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(hyperparameters) - set(accepted))
    if unknown:
        raise TypeError(f"{name} got unknown hyper-parameter(s) {unknown}; it accepts {accepted}")
    return cls(**hyperparameters)
