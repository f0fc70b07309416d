"""gTop-k (Shi et al., "A Distributed Synchronous SGD Algorithm with Global Top-k
Sparsification for Low Bandwidth Networks", ICDCS 2019).

1. Every rank takes its local top-``k`` (indices, values) of ``acc``.
2. ``ceil(log2 P)`` rounds of a binary tree toward rank 0: in round ``j``
   rank ``r`` with ``r mod 2^(j+1) = 2^j`` sends its pairs to ``r - 2^j``
   (point to point, as an ``alltoall`` with one non-zero split), which sums
   values on equal indices and keeps the top-``k`` of the merged set.  A rank
   without a partner (``P`` not a power of two) keeps its set for the round.
3. Rank 0 broadcasts the final index set ``F`` (at most ``k``).
4. **Decision (ours):** the values at ``F`` are then allreduced from every
   rank's *own local selection* (its ``acc`` on ``F`` intersected with its
   local top-``k``, zero elsewhere).  This is the tree's sum plus the
   contributions a merge dropped on the way, so a rank can zero exactly its
   own selections in ``F`` (the paper's residual rule) without losing a
   contribution that was discarded mid-tree.  Cost: ``k`` more values.
Residual: each rank zeroes its own local selections that are in ``F``.
Traffic ``O(k log P)`` per worker; build-up at most 1.
"""

import math

import numpy as np

from .base import Sparsifier, step_metrics


def tree_partner(rank, size, round_):
    """``("send", r)``, ``("receive", r)`` or ``(None, None)`` for this round."""
    stride = 1 << round_
    if rank % (2 * stride) == stride:
        return "send", rank - stride
    if rank % (2 * stride) == 0 and rank + stride < size:
        return "receive", rank + stride
    return None, None


class GTopK(Sparsifier):
    name = "gtopk"

    def exchange(self, acc, context):
        ops, n, rank, size = context.ops, context.layout.n, context.rank, context.size
        k = min(self.k(n), n)
        with context.timed_selection():
            local = ops.topk_abs_indices(acc, k, 0, n)
            indices, values = local, ops.take(acc, local)
        counts = context.exchange_header(len(local))[:, 0]
        for round_ in range(math.ceil(math.log2(size)) if size > 1 else 0):
            role, partner = tree_partner(rank, size, round_)
            splits = [0] * size
            if role == "send":
                splits[partner] = len(indices)
            outgoing = slice(0, len(indices) if role == "send" else 0)
            received_indices, _ = context.alltoall_indices(indices[outgoing], splits)
            received_values, _ = context.alltoall_values(values[outgoing], splits)
            if role == "receive":
                with context.timed_selection():
                    merged, sums = ops.merge_sum(indices, values, received_indices, received_values)
                    best = ops.topk_abs_indices(sums, k, 0, len(merged))
                    indices, values = ops.take(merged, best), ops.take(sums, best)
            elif role == "send":
                indices, values = indices[:0], values[:0]
        final = self._broadcast_final(context, indices, acc)
        aggregate = context.new_aggregate()
        mine = ops.intersect(final, local)
        ops.scatter_add(aggregate, mine, ops.take(acc, mine))  # own contributions, on F
        summed = context.allreduce_values(ops.take(aggregate, final))
        ops.fill_zero(aggregate)
        ops.scatter_add(aggregate, final, context.reduced(summed))
        context.clear(mine)
        return aggregate, step_metrics(context, k, counts, len(final))

    @staticmethod
    def _broadcast_final(context, indices, like):
        """Rank 0's final set on every rank (its size first, then the indices)."""
        count = int(context.broadcast_host(np.array([len(indices)], dtype=np.int64), 0)[0])
        own = indices if context.rank == 0 else context.ops.arange(0, count, like)
        return context.broadcast_indices(own, 0)
