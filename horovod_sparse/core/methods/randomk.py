"""Random-k with error feedback (the random-sparsification baseline, e.g. Stich et
al., "Sparsified SGD with Memory", NeurIPS 2018).

At step ``t`` every rank draws the same ``k`` distinct coordinates from a
generator seeded with ``(seed, t)``, so no index is ever sent: the ranks
allreduce their ``acc`` values there, divide by ``P``, and zero those
coordinates (identical on every rank).  Selection ``O(k)``; traffic ``k``
values; build-up 1; no bias correction (error feedback keeps the rest).
"""

import numpy as np

from ..arguments import check_integer
from .base import Sparsifier, average_disjoint, step_metrics


def random_indices(seed, step, n, k):
    """The ``k`` distinct coordinates of step ``step``, ascending (identical on every rank)."""
    return np.sort(np.random.default_rng([seed, step]).choice(n, size=k, replace=False))


class RandomK(Sparsifier):
    name = "randomk"

    def __init__(self, density=0.001, seed=0):
        super().__init__(density)
        self.seed = check_integer("seed", seed, minimum=0)

    def exchange(self, acc, context):
        n, k = context.layout.n, self.k(context.layout.n)
        with context.timed_selection():
            indices = context.ops.from_host(random_indices(self.seed, context.step, n, k), acc)
        context.exchange_header(k)
        aggregate = average_disjoint(context, indices, acc)
        return aggregate, step_metrics(context, k, [k] * context.size, k)

    def __repr__(self):
        return f"RandomK(density={self.density}, seed={self.seed})"
