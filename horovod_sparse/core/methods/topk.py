"""Top-k with error feedback (the baseline of Shi et al., "Understanding Top-k
Sparsification in Distributed Deep Learning", 2019).

Each worker selects ``idx = topk(|acc|, k)`` over the whole vector.  Then one
of two variants:

``variant="gather"`` (default)
    the workers allgather (indices, values), and every worker adds all
    lists, each value divided by ``P``, into a dense vector in worker order
    (identical bits everywhere).  Residual: zero the coordinates *this*
    worker sent.  Traffic ``2k`` sent and ``2k(P-1)`` received.
``variant="union"`` (the baseline of the MiCRO, ExDyna and DEFT papers)
    the workers allgather the index lists only; at their union ``U``
    (duplicates removed) every worker's ``acc`` is allreduced and divided by
    ``P``.  Residual: every worker zeroes all of ``U`` -- it sent its value
    there.  Traffic ``k`` indices sent, ``k(P-1)`` received, then an
    allreduce of ``|U| <= Pk`` values.

Selection ``O(n log k)``; build-up up to ``P`` (``|U|`` up to ``Pk``).
"""

from ..arguments import check_choice
from .base import Sparsifier, average_disjoint, average_gathered, step_metrics

VARIANTS = ("gather", "union")


class TopK(Sparsifier):
    name = "topk"

    def __init__(self, density=0.001, variant="gather"):
        super().__init__(density)
        self.variant = check_choice("variant", variant, VARIANTS)

    def exchange(self, acc, context):
        ops, n = context.ops, context.layout.n
        k = self.k(n)
        with context.timed_selection():
            indices = ops.topk_abs_indices(acc, k, 0, n)
        counts = context.exchange_header(len(indices))[:, 0]
        if self.variant == "union":
            union = ops.unique(context.allgather_indices(indices, counts))
            aggregate = average_disjoint(context, union, acc)
            return aggregate, step_metrics(context, k, counts, len(union))
        with context.timed_selection():
            values = ops.take(acc, indices)
        aggregate, gathered = average_gathered(context, indices, values, counts)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered))

    def __repr__(self):
        return f"TopK(density={self.density}, variant={self.variant!r})"
