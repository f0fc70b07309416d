"""Horovod ``Compressor`` that exchanges the whole model's gradient sparsely.

Horovod's ``DistributedOptimizer`` calls ``compress(grad)`` once per
parameter from the backward hooks, allreduces what it returns, and calls
``decompress(output, ctx)`` per parameter in ``synchronize()`` -- every
``compress`` of a step before any ``decompress``.  :class:`SparseCompressor`
uses that order to run the *whole-model* algorithm:

* ``compress`` records the gradient and returns a one-element float32
  placeholder (Horovod's own allreduce then moves 4 bytes per parameter);
* the first ``decompress`` of the step flattens all recorded gradients in a
  fixed order, runs :class:`~horovod_sparse.core.GradientExchange` (selection,
  error feedback, Horovod allgather/allreduce of the sparse data) and caches
  the averaged aggregate; every ``decompress`` returns its parameter's slice.

Identification: Horovod passes ``p.grad`` without a name.  With
``named_parameters`` the compressor recognises each gradient by identity
(``tensor is p.grad``) and orders the flat vector as ``named_parameters``
does, whatever order the hooks fire in; without it, gradients are named
``grad.<i>`` by the order of the ``compress`` calls, which Horovod keeps
fixed for a given model.  Either way every step the ranks compare a
fingerprint of names, shapes and dtypes, so a mismatch raises on all ranks.

Tensors that are not floating point, or empty, pass through unchanged
(Horovod allreduces them as usual).
"""


import torch

from ..core import Layout, create
from ..core.compressor import WholeModelCompressor, method_factories
from ..core.consistency import check_identical
from .comm import HorovodTorchCommunicator
from .ops import TorchOps


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class SparseCompressor(WholeModelCompressor):
    """A stateful Horovod compressor; use one instance per ``DistributedOptimizer``.

    Parameters
    ----------
    sparsifier : a core sparsifier (``horovod_sparse.create(name, **kw)``).
    named_parameters : optional ``model.named_parameters()``; names the
        residuals in ``state_dict`` and fixes the flattening order.
    nonfinite : ``"raise"`` or ``"skip"`` (see ``core.exchange``).
    process_set : Horovod process set to exchange within (default: all ranks).
    check_every : with ``named_parameters``, every this many steps check (before
        the exchange) that all ranks hold bit-identical parameters; raises
        :class:`~horovod_sparse.core.ParameterDivergenceError` naming the first
        differing tensor on every rank.  ``None`` (default) never checks.

    Metrics (``metrics()``, ``history``, ``summary()``) and checkpoint state
    (``state_dict(all_ranks=False)``, ``load_state_dict``) come from
    :class:`~horovod_sparse.core.compressor.WholeModelCompressor`.
    """

    def __init__(self, sparsifier, named_parameters=None, nonfinite="raise", process_set=None,
                 check_every=None):
        super().__init__(sparsifier, nonfinite)
        self._named = list(named_parameters) if named_parameters is not None else None
        self._order = {name: i for i, (name, _) in enumerate(self._named or [])}
        self._process_set = process_set
        if check_every is not None and (isinstance(check_every, bool) or not isinstance(
                check_every, int) or check_every < 1 or self._named is None):
            raise ValueError("check_every must be a positive integer (and named_parameters "
                             f"given), got {check_every!r}")
        self._check_every = check_every
        self._recorded = []       # (name, tensor) compressed this step
        self._aggregates = None   # per recorded slot, after the step's exchange

    # -- Horovod's Compressor interface ---------------------------------------
    def compress(self, tensor):
        if not tensor.is_floating_point() or tensor.numel() == 0:
            return tensor, None
        if self._aggregates is not None:  # first compress after an exchange: a new step
            self._aggregates, self._recorded = None, []
        self._recorded.append((self._name_of(tensor), tensor))
        # float32 whatever the gradient's dtype: Horovod cannot allreduce bfloat16 on CPU
        return torch.zeros(1, device=tensor.device), _Slot(len(self._recorded) - 1)

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        if self._aggregates is None:
            self._aggregates = self._exchange_step()
        return self._aggregates[ctx.index]

    # -------------------------------------------------------------------------
    def _ops(self):
        return TorchOps()

    def _communicator(self):
        return HorovodTorchCommunicator(self._process_set)

    def _name_of(self, tensor):
        if self._named is None:
            return f"grad.{len(self._recorded)}"
        for name, parameter in self._named:
            if parameter.grad is tensor:
                return name
        raise ValueError("a gradient handed to compress() belongs to none of the "
                         "named_parameters given to the compressor")

    def _exchange_step(self):
        steps_done = self.gradient_exchange.step_count
        if self._check_every and steps_done % self._check_every == 0:
            check_parameters(self._named, self.comm)
        order = sorted(range(len(self._recorded)),
                       key=lambda i: self._order.get(self._recorded[i][0], i))
        recorded = [self._recorded[i] for i in order]
        layout = Layout(names=tuple(name for name, _ in recorded),
                        shapes=tuple(tuple(t.shape) for _, t in recorded),
                        dtypes=tuple(str(t.dtype) for _, t in recorded))
        flat = self.exchange([t.detach().reshape(-1) for _, t in recorded], layout)
        aggregates = [None] * len(recorded)
        for slot, (start, stop), (_, tensor) in zip(order, layout.bounds, recorded):
            aggregates[slot] = flat[start:stop].view(tensor.shape).to(tensor.dtype)
        return aggregates


def check_parameters(named_parameters, comm=None):
    """The consistency guard: raise on every rank unless all ranks hold
    bit-identical parameters (``comm``: default all ranks)."""
    named = list(named_parameters)
    comm = comm if comm is not None else HorovodTorchCommunicator()
    views = [p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy() for _, p in named]
    check_identical([name for name, _ in named], views, comm)


@method_factories
class Compression:
    """Factories, used like Horovod's ``hvd.Compression.fp16``::

        opt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(),
            compression=horovod_sparse.torch.Compression.exdyna(density=0.001))

    Every factory takes ``density`` and the method's hyper-parameters, plus
    the optional ``named_parameters``, ``nonfinite`` and ``process_set``.
    """

    @staticmethod
    def create(name, named_parameters=None, nonfinite="raise", process_set=None, check_every=None,
               **hyperparameters):
        return SparseCompressor(create(name, **hyperparameters), named_parameters=named_parameters,
                                nonfinite=nonfinite, process_set=process_set,
                                check_every=check_every)


__all__ = ["Compression", "SparseCompressor", "check_parameters"]
