"""What every sparsifier shares: the density contract and the final aggregation."""

import math

import numpy as np

from ..arguments import check_density
from ..metrics import StepMetrics


REGISTRY = {}  # method name -> its Sparsifier subclass, filled as the method modules load


class Sparsifier:
    """Base class: ``k = max(1, floor(density * n))`` and the state protocol.

    A subclass that sets ``name`` registers itself under it (:data:`REGISTRY`,
    read by :func:`horovod_sparse.core.create`): a new method is one module
    in this package.  ``class Probe(Sparsifier, register=False)`` stays out
    (a test double).

    A subclass implements ``exchange(acc, context) -> (aggregate, metrics)``:
    select from the flat accumulated gradient ``acc``, communicate through
    the context's collectives, zero what it communicated with
    ``context.clear`` (error feedback) and return the reduced dense aggregate
    (``context.reduced``), identical on every rank.  Its first collective is
    ``context.exchange_header`` (the context refuses any other before it);
    it changes its own state only after the header.

    ``momentum`` (> 0 turns on momentum correction in the error feedback;
    ``nesterov`` its look-ahead form), ``clip_norm`` (local gradient
    clipping) and ``dense_1d`` (every
    one-dimensional gradient sent densely, beside the user's ``dense_1d``)
    are read by the driver.
    """

    name = None
    momentum = 0.0
    clip_norm = None
    nesterov = False
    dense_1d = False

    def __init_subclass__(cls, register=True, **kwargs):
        super().__init_subclass__(**kwargs)
        if not register or "name" not in cls.__dict__:
            return
        known = REGISTRY.get(cls.name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"{cls.__qualname__} and {known.__qualname__} are both named {cls.name!r}")
        REGISTRY[cls.name] = cls

    def __init__(self, density=0.001):
        self.density = check_density(density)

    def k(self, n):
        return max(1, math.floor(self.density * n))

    def scan_request(self, n, rank, size, step):
        """``(start, stop, threshold, expected)``: the scan of ``|acc_i| >=
        threshold > 0`` over ``[start, stop)`` (about ``expected`` hits) that
        ``exchange`` will make at ``step``, for the driver to collect while it
        forms ``acc`` (``context.scanned``); ``None`` (the default): none known
        before the step."""
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        if state:
            raise ValueError(f"{self.name} keeps no state, got {sorted(state)}")

    def __repr__(self):
        return f"{type(self).__name__}(density={self.density})"


def average_disjoint(context, union, acc):
    """Allreduce every rank's ``acc`` at the (duplicate-free) ``union``, reduce
    (average over ``P``) and scatter into a dense aggregate; clear ``union`` on
    every rank."""
    ops = context.ops
    summed = context.allreduce_values(ops.take(acc, union))
    aggregate = context.new_aggregate()
    ops.scatter_add(aggregate, union, context.reduced(summed))
    context.clear(union)
    return aggregate


def allgather_padded(context, indices, counts):
    """Allgather index lists as an equal-size allgather does (NCCL's, in the papers'
    code): every rank sends its list padded to the longest, the padding is
    dropped after.  The same result as ``context.allgather_indices``; the
    traffic is ``P * max(counts)`` instead of ``sum(counts)``."""
    ops, longest = context.ops, int(max(counts))
    padded = ops.concat([indices, ops.arange(0, longest - len(indices), indices)])
    gathered = context.allgather_indices(padded, [longest] * context.size)
    return ops.concat([gathered[rank * longest:rank * longest + int(count)]
                       for rank, count in enumerate(counts)])


def average_gathered(context, indices, values, counts):
    """Allgather every rank's (indices, values) and add the lists, each value reduced
    (divided by ``P``), in rank order (identical bits everywhere).  Clears this
    rank's own ``indices``.  Returns ``(aggregate, gathered indices)``."""
    ops = context.ops
    gathered = context.allgather_indices(indices, counts)
    gathered_values = context.allgather_values(values, counts)
    aggregate = context.new_aggregate()
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for start, stop in zip(offsets[:-1], offsets[1:]):
        ops.scatter_add(aggregate, gathered[start:stop],
                        context.reduced(gathered_values[start:stop]))
    context.clear(indices)
    return aggregate, gathered












def step_metrics(context, k, counts, nnz, threshold=float("nan")):
    return StepMetrics(step=context.step, n=context.layout.n, k=k,
                       counts=[int(c) for c in counts], nnz=int(nnz), threshold=float(threshold))
