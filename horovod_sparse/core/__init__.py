"""Framework-agnostic core of horovod_sparse (imports neither torch nor tensorflow).

* ``ops``: the array-operations interface (numpy implementation here);
* ``comm``: the collectives interface, traffic metering, an in-process simulator;
* ``layout``, ``feedback``, ``metrics``, ``threshold``, ``partition``: the
  pieces the methods are built from;
* ``methods``: the sparsifiers; ``registry.create(name, **kw)`` builds one;
* ``exchange.GradientExchange``: the per-step driver the adapters call.
"""

from .comm import Communicator, SimulatedCommunicator, run_simulated
from .errors import (ConfigurationMismatchError, HorovodSparseError, ModelMismatchError, NonFiniteGradientError,
                     ParameterDivergenceError)
from .exchange import GradientExchange
from .layout import Layout
from .metrics import StepMetrics, summarize
from .ops import ArrayOps, NumpyOps
from .registry import available, create

__all__ = ["ArrayOps", "Communicator", "ConfigurationMismatchError", "GradientExchange", "HorovodSparseError", "Layout",
           "ModelMismatchError", "NonFiniteGradientError", "NumpyOps", "ParameterDivergenceError", "SimulatedCommunicator",
           "StepMetrics", "available", "create", "run_simulated", "summarize"]
