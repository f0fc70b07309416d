"""CLT-k, cyclic local top-k (Chen et al., "ScaleCom", NeurIPS 2020).

At step ``t`` the leader ``t mod P`` selects the top-``k`` of its own ``acc``
and broadcasts the ``k`` indices; every rank allreduces its ``acc`` at those
indices, divides by ``P`` and zeroes them.  Selection ``O(n log k)`` on the
leader only; traffic ``k`` indices + ``k`` values; build-up 1 (the imbalance
metric is ``P - 1``: one worker selects everything).
"""

from .base import Sparsifier, average_disjoint, step_metrics


class CLTK(Sparsifier):
    name = "cltk"

    def exchange(self, acc, context):
        ops, n, rank, size = context.ops, context.layout.n, context.rank, context.size
        k = min(self.k(n), n)
        leader = context.step % size
        with context.timed_selection():
            if rank == leader:
                indices = ops.topk_abs_indices(acc, k, 0, n)
            else:
                indices = ops.arange(0, k, acc)  # receive buffer
        counts = context.exchange_header(k if rank == leader else 0)[:, 0]
        indices = context.broadcast_indices(indices, leader)
        aggregate = average_disjoint(context, indices, acc)
        return aggregate, step_metrics(context, k, counts, k)
