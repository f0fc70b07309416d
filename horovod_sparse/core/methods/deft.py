"""DEFT (Yoon & Oh, ICPP 2023): layer-wise budgets, bin-packed exclusive segments.

1. Segments: every gradient tensor; tensors over ``n/P`` elements are cut into
   ``P`` nearly equal contiguous sub-segments.
2. Budgets from the worker's own ``acc``: visit segments by descending L2 norm,
   ``k_l = min(size_l, max(1, floor(k_rem * norm_l / norm_rem)))``, then
   subtract from ``k_rem`` and ``norm_rem``.  ``budget="exact"`` (default,
   ours): ``k_l = 0`` once ``k_rem`` is spent, and whatever size caps leave
   over goes to later segments with room, so budgets sum to ``k``.
   ``budget="paper"`` (the released code): every segment gets at least one
   coordinate even after ``k_rem`` is spent, nothing is handed on, and the
   total can exceed ``k`` (by one per segment at most).
3. The rotating leader ``t mod P`` bin-packs its segments into ``P`` bins
   (largest cost ``size_l * log2(k_l)`` first -- ``size_l`` when ``k_l <= 1``
   -- into the least-loaded bin); segments with ``k_l == size_l`` go to a
   "common" list that every worker sends densely.  The assignment rides in
   the step's header (the leader's row); worker ``r`` takes bin
   ``(t + r) mod P``.  The selection counts follow in a second small allgather.
4. Selection: exact top-``k_l`` (own budget) inside each assigned segment,
   about ``(n/P) log(k/P)`` per worker.
5. Communication and residual as MiCRO: the bins are disjoint, the common
   segments are added to the allreduced union and zeroed everywhere.
"""

import math

import numpy as np

from ..arguments import check_choice
from .base import Sparsifier, average_disjoint, step_metrics

COMMON = -1


def deft_segments(layout, size):
    """``(start, stop)`` of every segment of the flat gradient."""
    limit = layout.n / size
    segments = []
    for start, stop in layout.bounds:
        length = stop - start
        if length > limit:
            base, extra = divmod(length, size)
            for j in range(size):
                piece = base + (1 if j < extra else 0)
                if piece:
                    segments.append((start, start + piece))
                start += piece
        elif length:
            segments.append((start, stop))
    return segments


def deft_budgets(norms, sizes, k):
    """Norm-proportional budgets ``k_l`` (int64) that sum to ``min(k, sum(sizes))``."""
    norms = np.asarray(norms, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.int64)
    order = sorted(range(len(norms)), key=lambda l: (-norms[l], l))
    budgets = np.zeros(len(norms), dtype=np.int64)
    k_rem, norm_rem = int(k), math.fsum(norms)
    for l in order:
        if k_rem <= 0:
            break
        share = math.floor(k_rem * norms[l] / norm_rem) if norm_rem > 0 else 0
        budgets[l] = min(sizes[l], max(1, share))
        k_rem -= int(budgets[l])
        norm_rem -= norms[l]
    for l in order:  # leftovers of rounding and size caps, in the same order
        if k_rem <= 0:
            break
        extra = min(k_rem, int(sizes[l] - budgets[l]))
        budgets[l] += extra
        k_rem -= extra
    return budgets


def deft_paper_budgets(norms, sizes, k):
    """The released code's budgets: over ``argsort(norms)[::-1]``,
    ``k_l = size_l`` if ``size_l < t`` else ``max(1, t)`` with
    ``t = int(k_rem * norm_l / norm_rem)`` (0 once ``norm_rem`` is 0); ``k_rem``
    may go negative.  Every segment gets at least 1; the sum can exceed ``k``."""
    norms = np.asarray(norms, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.int64)
    budgets = np.zeros(len(norms), dtype=np.int64)
    k_rem, norm_rem = int(k), sum(norms.tolist())  # summed in order, as the code does
    for l in np.argsort(norms)[::-1]:
        share = int(k_rem * norms[l] / norm_rem) if norm_rem > 0 else 0
        budgets[l] = sizes[l] if sizes[l] < share else max(1, share)
        k_rem -= int(budgets[l])
        norm_rem -= norms[l]
    return budgets


BUDGETS = {"exact": deft_budgets, "paper": deft_paper_budgets}


def deft_assignment(budgets, sizes, size):
    """Bin of every segment (``COMMON`` for segments sent densely by all)."""
    budgets, sizes = np.asarray(budgets), np.asarray(sizes)
    assignment = np.full(len(budgets), COMMON, dtype=np.int64)
    costs = np.where(budgets > 1, sizes * np.log2(np.maximum(budgets, 2)), sizes).astype(np.float64)
    loads = np.zeros(size, dtype=np.float64)
    candidates = [l for l in range(len(budgets)) if 0 < budgets[l] < sizes[l]]
    for l in sorted(candidates, key=lambda l: (-costs[l], l)):
        target = int(np.argmin(loads))
        assignment[l] = target
        loads[target] += costs[l]
    assignment[budgets == sizes] = COMMON
    assignment[(budgets == 0) & (sizes > 0)] = size  # a bin nobody takes: not sent this step
    return assignment


class DEFT(Sparsifier):
    name = "deft"

    def __init__(self, density=0.001, budget="exact"):
        super().__init__(density)
        self.budget = check_choice("budget", budget, BUDGETS)

    def exchange(self, acc, context):
        ops, layout = context.ops, context.layout
        k, size, rank, step = self.k(layout.n), context.size, context.rank, context.step
        segments = deft_segments(layout, size)
        sizes = np.array([stop - start for start, stop in segments], dtype=np.int64)
        leader = step % size
        with context.timed_selection():
            norms = np.sqrt(ops.segment_sq_norms(acc, segments))
            if not np.isfinite(norms).all():  # the header rejects this step on every rank
                norms = np.zeros_like(norms)
            budgets = BUDGETS[self.budget](norms, sizes, k)
            mine = deft_assignment(budgets, sizes, size) if rank == leader else np.zeros(
                len(segments), dtype=np.int64)
        assignment = context.exchange_header(*mine)[leader]
        own_bin = (step + rank) % size
        with context.timed_selection():
            selected = [ops.topk_abs_indices(acc, int(budgets[l]), *segments[l])
                        for l in np.flatnonzero(assignment == own_bin)]
            indices = ops.concat(selected) if selected else ops.arange(0, 0, acc)
        counts = context.allgather_host(np.array([len(indices)], dtype=np.int64))[:, 0]
        union = context.allgather_indices(indices, counts)
        common = [ops.arange(*segments[l], acc) for l in np.flatnonzero(assignment == COMMON)]
        if common:
            union = ops.concat([union] + common)
        aggregate = average_disjoint(context, union, acc)
        common_size = int(sizes[assignment == COMMON].sum())
        metrics = step_metrics(context, k, counts, counts.sum() + common_size)
        metrics.extra["common_elements"] = common_size
        return aggregate, metrics

    def __repr__(self):
        return f"DEFT(density={self.density}, budget={self.budget!r})"
