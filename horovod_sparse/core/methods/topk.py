"""Top-k with error feedback (the baseline of Shi et al., "Understanding Top-k
Sparsification in Distributed Deep Learning", 2019).

Each worker selects ``idx = topk(|acc|, k)`` over the whole vector, the
workers allgather (indices, values), and every worker adds all lists, each
value divided by ``P``, into a dense vector in worker order (identical bits
everywhere).
Residual: zero the coordinates *this* worker sent.  Selection
``O(n log k)``; traffic ``2k`` sent and ``2k(P-1)`` received; build-up up to
``P`` (the union may hold up to ``Pk`` coordinates).
"""

import numpy as np

from .base import Sparsifier, gather_indices, step_metrics


class TopK(Sparsifier):
    name = "topk"

    def exchange(self, acc, context):
        ops, comm, n = context.ops, context.comm, context.layout.n
        k = self.k(n)
        with context.timed_selection():
            indices = ops.topk_abs_indices(acc, k, 0, n)
            values = ops.take(acc, indices)
        counts = context.exchange_header(len(indices))[:, 0]
        gathered = gather_indices(context, indices, counts)
        with context.timed_communication():
            gathered_values = comm.allgather(values, counts)
        aggregate = context.new_aggregate()
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for start, stop in zip(offsets[:-1], offsets[1:]):
            ops.scatter_add(aggregate, gathered[start:stop],
                            ops.divide(gathered_values[start:stop], comm.size))
        ops.zero_at(acc, indices)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered))
