"""Hard-threshold sparsification (Sahu et al., "Rethinking gradient sparsification
as total error minimization", NeurIPS 2021).

Every rank selects ``{i : |acc_i| >= thr}`` over the whole vector with the
fixed ``thr = 1 / (2 sqrt(k))`` (or the given ``threshold``); the ranks
allgather the index lists, take their union ``U``, allreduce every rank's
``acc`` on ``U``, divide by ``P`` and zero ``U`` on every rank.  Selection
``O(n)``; the density is *not* controlled (it follows the gradient scale).
"""

from ..threshold import paper_initial_threshold
from ..arguments import check_number
from .base import Sparsifier, average_disjoint, step_metrics


class HardThreshold(Sparsifier):
    name = "threshold"

    def __init__(self, density=0.001, threshold=None):
        super().__init__(density)
        self.threshold = check_number("threshold", threshold, allow_none=True)

    def threshold_for(self, k):
        return self.threshold if self.threshold is not None else paper_initial_threshold(k)

    def exchange(self, acc, context):
        ops, n = context.ops, context.layout.n
        k = self.k(n)
        threshold = self.threshold_for(k)
        with context.timed_selection():
            indices = ops.abs_ge_indices(acc, threshold, 0, n)
        counts = context.exchange_header(len(indices))[:, 0]
        union = ops.unique(context.allgather_indices(indices, counts))
        aggregate = average_disjoint(context, union, acc)
        return aggregate, step_metrics(context, k, counts, len(union), threshold)

    def __repr__(self):
        return f"HardThreshold(density={self.density}, threshold={self.threshold})"
