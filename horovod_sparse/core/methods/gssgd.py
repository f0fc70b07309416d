"""gs-SGD, global-sketching SGD: our reconstruction (only the abstract is public;
see docs/methods.md).

Worker state as Sketched-SGD (Ivkin et al., NeurIPS 2019): momentum
``u = rho u + g`` and accumulator ``v = v + u`` (``acc = v``).  Per step:

1. every rank sketches ``v`` in a Count Sketch (``rows x columns``, hashes
   from the shared ``seed``; :mod:`horovod_sparse.core.sketch`): by default
   ``ceil(log2(n) / 4)`` rows (at least 3) and ``4k`` columns, the
   ``O(k log n)`` size of Sketched-SGD's analysis;
2. the tables are summed (the sketch is linear), so every rank holds the
   sketch of ``sum_r v_r``: by one allreduce (``merge="allreduce"``) or by
   ``log2 P`` rounds of recursive doubling (``merge="tree"``, the paper's
   decentralized ``log P`` aggregation: in round ``j`` rank ``r`` swaps its
   partial sum with rank ``r XOR 2^j`` and adds; ``P`` a power of two);
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

Traffic ``rows * columns`` (allreduce; ``log2 P`` times that by the tree)
``+ ~c k`` indices ``+ ~c k`` values; selection ``O(n * rows)`` for the sketch
plus ``O(n rows / P)`` for the estimates; build-up at most 1.  With ``rho > 0``
use plain SGD in the optimizer (the momentum lives here).
"""

import numpy as np

from ..kernels import HASH_PRIME
from ..partition import even_bounds
from ..sketch import CountSketch, rows_for
from ..arguments import check_choice, check_integer, check_momentum, check_number
from .base import Sparsifier, step_metrics

MERGES = ("allreduce", "tree")
OCTAVES = 40
STEPS_PER_OCTAVE = 8


def candidate_ladder(top):
    """Ascending thresholds shared by all ranks: 0 and ``top * (1 - f/16) * 2^-o``
    for ``f < 8``, ``o < 40`` (eight rungs an octave, exact dyadic ratios)."""
    fractions = 1.0 - np.arange(STEPS_PER_OCTAVE) / 16.0
    rungs = [np.ldexp(top * fractions, -octave) for octave in range(OCTAVES)]
    return np.concatenate([[0.0], np.sort(np.concatenate(rungs))])


def recursive_doubling_sum(context, table):
    """``sum_r table_r`` on every rank in ``log2 P`` exchanges (``P`` a power of
    two): in round ``j`` rank ``r`` sends its partial sum to rank ``r XOR 2^j``
    and adds the one it receives.  Both partners add the same two vectors, so
    the sums agree bit for bit on every rank."""
    distance = 1
    while distance < context.size:
        splits = [0] * context.size
        splits[context.rank ^ distance] = len(table)
        received, _ = context.alltoall(table, splits)
        context.ops.add_slice(table, table, received, 0, len(table))
        distance *= 2
    return table


def highest_rung_reaching(totals, target):
    """Index of the highest rung whose (non-increasing) global count is ``>= target``."""
    reached = np.flatnonzero(np.asarray(totals) >= target)
    return int(reached[-1]) if reached.size else 0


class GsSGD(Sparsifier):
    name = "gssgd"

    def __init__(self, density=0.001, rows=None, columns=None, candidates=4, momentum=0.9,
                 seed=0, merge="allreduce"):
        super().__init__(density)
        self.rows = check_integer("rows", rows, allow_none=True)
        self.columns = check_integer("columns", columns, allow_none=True)
        self.candidates = check_number("candidates", candidates)
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates!r}")
        self.momentum = check_momentum(momentum)
        self.seed = check_integer("seed", seed, minimum=0)
        self.merge = check_choice("merge", merge, MERGES)
        self._sketch = None

    def shape_for(self, n, k):
        """Sketch ``(rows, columns)``: by default ``ceil(log2(n) / 4)`` (at least 3) x ``4k``."""
        return (self.rows if self.rows is not None else rows_for(n),
                self.columns if self.columns is not None else 4 * k)

    def sketch(self, ops, n, k):
        rows, columns = self.shape_for(n, k)
        cached = self._sketch
        if cached is None or (cached.rows, cached.columns) != (rows, columns) or cached.ops is not ops:
            self._sketch = CountSketch(ops, rows, columns, self.seed)
        return self._sketch

    def exchange(self, acc, context):
        ops, n, rank, size = context.ops, context.layout.n, context.rank, context.size
        if n >= HASH_PRIME:
            raise ValueError(f"gssgd hashes coordinates below 2**31 - 1; this model has {n}")
        if self.merge == "tree" and size & (size - 1):
            raise ValueError(f"gssgd(merge='tree') needs a power-of-two number of ranks, not "
                             f"{size}; use merge='allreduce'")
        k = min(self.k(n), n)
        sketch = self.sketch(ops, n, k)
        with context.timed_selection():
            table = sketch.encode(acc, n)
        context.exchange_header(0)
        if self.merge == "tree":
            table = recursive_doubling_sum(context, table)
        else:
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
                f"candidates={self.candidates}, momentum={self.momentum}, seed={self.seed}, "
                f"merge={self.merge!r})")
