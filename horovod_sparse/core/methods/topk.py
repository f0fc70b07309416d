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

from .base import Sparsifier, average_gathered, step_metrics


class TopK(Sparsifier):
    name = "topk"

    def exchange(self, acc, context):
        ops, n = context.ops, context.layout.n
        k = self.k(n)
        with context.timed_selection():
            indices = ops.topk_abs_indices(acc, k, 0, n)
            values = ops.take(acc, indices)
        counts = context.exchange_header(len(indices))[:, 0]
        aggregate, gathered = average_gathered(context, indices, values, counts)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered))
