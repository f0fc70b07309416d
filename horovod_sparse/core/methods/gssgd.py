"""gs-SGD, global-sketching SGD: our reconstruction (only the abstract is public;
see docs/methods.md).

Worker state as Sketched-SGD (Ivkin et al., NeurIPS 2019): momentum
``u = rho u + g`` and accumulator ``v = v + u`` (``acc = v``).  Per step:

1. every rank sketches ``v`` in a Count Sketch (``rows x columns``, hashes
   from the shared ``seed``; :mod:`horovod_sparse.core.sketch`);
2. the tables are summed with one allreduce (the sketch is linear), so every
   rank holds the sketch of ``sum_r v_r``;
3. rank ``r`` estimates only its even share ``n/P`` of the coordinates
   (median over rows).  To pick ``candidates * k`` global heavy hitters
   without sending estimates, the ranks allgather their counts of
   ``|estimate| >= rung`` on a shared ladder of thresholds (eight rungs an
   octave below ``max|table|``, down 40 octaves, and 0) and all take the highest
   rung whose global count reaches ``candidates * k``; each rank's
   candidates are its share's coordinates at or above it, allgathered;
4. second round: allreduce the exact ``v`` at the candidates, keep the top-``k``
   of the exact sums (ties to the lower index), divide by ``P``;
5. zero ``u`` and ``v`` at the ``k`` chosen coordinates on every rank.

Traffic ``rows * columns`` (allreduce) ``+ ~c k`` indices ``+ ~c k`` values,
independent of ``P``; selection ``O(n * rows)`` for the sketch plus
``O(n rows / P)`` for the estimates; build-up at most 1.  With ``rho > 0``
use plain SGD in the optimizer (the momentum lives here).
"""

import numpy as np

from ..partition import even_bounds
from ..sketch import CountSketch
from .base import (Sparsifier, check_momentum, check_positive, check_positive_int, check_seed,
                   step_metrics)

OCTAVES = 40
STEPS_PER_OCTAVE = 8


def candidate_ladder(top):
    """Ascending thresholds shared by all ranks: 0 and ``top * (1 - f/16) * 2^-o``
    for ``f < 8``, ``o < 40`` (eight rungs an octave, exact dyadic ratios)."""
    fractions = 1.0 - np.arange(STEPS_PER_OCTAVE) / 16.0
    rungs = [np.ldexp(top * fractions, -octave) for octave in range(OCTAVES)]
    return np.concatenate([[0.0], np.sort(np.concatenate(rungs))])


def highest_rung_reaching(totals, target):
    """Index of the highest rung whose (non-increasing) global count is ``>= target``."""
    reached = np.flatnonzero(np.asarray(totals) >= target)
    return int(reached[-1]) if reached.size else 0


class GsSGD(Sparsifier):
    name = "gssgd"

    def __init__(self, density=0.001, rows=5, columns=None, candidates=4, momentum=0.9, seed=0):
        super().__init__(density)
        self.rows = check_positive_int("rows", rows)
        self.columns = check_positive_int("columns", columns, allow_none=True)
        self.candidates = check_positive("candidates", candidates)
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates!r}")
        self.momentum = check_momentum(momentum)
        self.seed = check_seed(seed)
        self._sketch = None

    def columns_for(self, k):
        """Default sketch width: ``4k`` columns."""
        return self.columns if self.columns is not None else 4 * k

    def sketch(self, ops, k):
        columns = self.columns_for(k)
        if self._sketch is None or self._sketch.columns != columns or self._sketch.ops is not ops:
            self._sketch = CountSketch(ops, self.rows, columns, self.seed)
        return self._sketch

    def exchange(self, acc, context):
        ops, n, rank, size = context.ops, context.layout.n, context.rank, context.size
        k = min(self.k(n), n)
        sketch = self.sketch(ops, k)
        with context.timed_selection():
            table = sketch.encode(acc, n)
        context.exchange_header(0)
        table = context.allreduce_sum(table)
        start, stop = even_bounds(n, size)[rank]
        with context.timed_selection():
            estimates = sketch.estimate(table, start, stop)
            rungs = candidate_ladder(ops.max_abs(table))
            ladder_counts = ops.count_abs_ge_each(estimates, rungs)
        ladder = context.allgather_host(ladder_counts)
        chosen = highest_rung_reaching(ladder.sum(axis=0), self.candidates * k)
        counts = ladder[:, chosen]
        with context.timed_selection():
            local = ops.abs_ge_indices(estimates, rungs[chosen], 0, stop - start) + start
        candidates = context.allgather_indices(local, counts)
        exact = context.allreduce_values(ops.take(acc, candidates))
        with context.timed_selection():
            best = ops.topk_abs_indices(exact, k, 0, len(candidates))
            selected = ops.take(candidates, best)
        aggregate = context.new_aggregate()
        ops.scatter_add(aggregate, selected, context.reduced(ops.take(exact, best)))
        context.clear(selected)
        return aggregate, step_metrics(context, k, counts, len(selected), rungs[chosen])

    def __repr__(self):
        return (f"GsSGD(density={self.density}, rows={self.rows}, columns={self.columns}, "
                f"candidates={self.candidates}, momentum={self.momentum}, seed={self.seed})")
