"""The framework-agnostic half of a whole-model Horovod compressor.

Horovod's ``Compressor`` sees one gradient at a time; the methods here need
the whole model's gradient.  Both adapters (PyTorch, TensorFlow) collect the
step's gradients from Horovod's ``compress`` calls and hand them, flattened in
a fixed order, to :meth:`WholeModelCompressor.exchange`.  This class owns what
is the same for every framework: the :class:`GradientExchange` (built at the
first step), the check that the model does not change between steps, the
metrics, and the state a checkpoint holds (see ``core.checkpoint``).
"""

from . import checkpoint
from .exchange import GradientExchange
from .metrics import summarize
from .registry import available


class WholeModelCompressor:
    """Subclasses provide ``_ops()`` and ``_communicator()`` of their framework."""

    def __init__(self, sparsifier, nonfinite="raise"):
        self.sparsifier = sparsifier
        self._nonfinite = nonfinite
        self._exchange = None
        self._comm = None
        self._pending_state = None
        self.layout = None

    def exchange(self, flat_grads, layout):
        """Average one step's gradients (``flat_grads[i]`` is ``layout`` entry ``i``)."""
        if self.layout is not None and layout != self.layout:
            raise ValueError("the gradients exchanged changed between steps (was: "
                             f"{self.layout.describe()}; now: {layout.describe()})")
        self.layout = layout
        return self.gradient_exchange.step(flat_grads, layout)

    @property
    def gradient_exchange(self):
        """The :class:`GradientExchange` (built, with any loaded state, on first use)."""
        if self._exchange is None:
            self._exchange = GradientExchange(self.sparsifier, self._ops(), self.comm,
                                              nonfinite=self._nonfinite)
            if self._pending_state is not None:
                self._exchange.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._exchange

    @property
    def comm(self):
        if self._comm is None:
            self._comm = self._communicator()
        return self._comm

    # -- metrics ----------------------------------------------------------------
    @property
    def history(self):
        """``StepMetrics`` of the steps so far on this rank (the newest 1,000), as a list."""
        return [] if self._exchange is None else list(self._exchange.history)

    def metrics(self):
        """``StepMetrics`` of the last step (``None`` before the first)."""
        return None if self._exchange is None else self._exchange.metrics

    def summary(self, skip_first=0):
        return summarize(self.history, skip_first)

    # -- state ------------------------------------------------------------------
    def state_dict(self, all_ranks=False):
        """This rank's step, residuals (by gradient name) and sparsifier state.

        ``all_ranks=True`` (collective: call it on every rank) returns every
        rank's state, ``{"ranks": [...]}``, for a checkpoint rank 0 alone
        writes; :meth:`load_state_dict` takes either form, on any number of
        ranks (``core.checkpoint.localize`` says what a new rank count gets).
        """
        if self._exchange is None:
            own = dict(self._pending_state or {})
        else:
            own = self._exchange.state_dict(self.layout)
        return checkpoint.gather(own, self.comm) if all_ranks else own

    def load_state_dict(self, state):
        own = checkpoint.localize(state, self.comm.rank, self.comm.size)
        if self._exchange is None:
            self._pending_state = own
        else:
            self._exchange.load_state_dict(own)

    # -- framework hooks ----------------------------------------------------------
    def _ops(self):
        raise NotImplementedError

    def _communicator(self):
        raise NotImplementedError


def method_factories(cls):
    """Class decorator for an adapter's ``Compression``: one static factory per
    method, ``Compression.exdyna(density=0.001, **options)``, calling
    ``cls.create(name, density=..., **options)``."""
    for method in available():
        setattr(cls, method, staticmethod(_factory(cls, method)))
    return cls


def _factory(cls, method):
    def factory(density=0.001, **options):
        return cls.create(method, density=density, **options)

    factory.__name__ = factory.__qualname__ = method
    factory.__doc__ = (f"A compressor running ``{method}`` (hyper-parameters: see "
                       "``horovod_sparse.core.methods`` and docs/methods.md).")
    return factory
