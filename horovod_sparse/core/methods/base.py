"""What every sparsifier shares: the density contract and the final aggregation."""

import math
import numbers

from ..metrics import StepMetrics


def check_density(density):
    if isinstance(density, bool) or not isinstance(density, numbers.Real):
        raise TypeError(f"density must be a number in (0, 1], got {density!r}")
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return float(density)


class Sparsifier:
    """Base class: ``k = max(1, floor(density * n))`` and the state protocol.

    A subclass implements ``exchange(acc, context) -> (aggregate, metrics)``:
    select from the flat accumulated gradient ``acc``, communicate through
    ``context.comm``, zero in ``acc`` what it communicated (error feedback)
    and return the averaged dense aggregate, identical on every rank.  It
    must call ``context.exchange_header`` before its first payload
    collective and change its own state only after it.
    """

    name = None

    def __init__(self, density=0.001):
        self.density = check_density(density)

    def k(self, n):
        return max(1, math.floor(self.density * n))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        if state:
            raise ValueError(f"{self.name} keeps no state, got {sorted(state)}")

    def __repr__(self):
        return f"{type(self).__name__}(density={self.density})"


def average_disjoint(context, union, acc):
    """Allreduce every rank's ``acc`` at the (duplicate-free) ``union``, average over
    ``P`` and scatter into a dense aggregate; zero ``union`` in ``acc``."""
    ops, comm = context.ops, context.comm
    with context.timed_communication():
        summed = comm.allreduce_sum(ops.take(acc, union))
    aggregate = context.new_aggregate()
    ops.scatter_add(aggregate, union, ops.divide(summed, comm.size))
    ops.zero_at(acc, union)
    return aggregate


def gather_indices(context, indices, counts):
    """Allgather every rank's selected indices (int32 on the wire), in rank order."""
    ops = context.ops
    with context.timed_communication():
        gathered = context.comm.allgather(ops.narrow_index(indices), counts)
    return ops.widen_index(gathered)


def step_metrics(context, k, counts, nnz, threshold=float("nan")):
    return StepMetrics(step=context.step, n=context.layout.n, k=k,
                       counts=[int(c) for c in counts], nnz=int(nnz), threshold=float(threshold))
