"""The exclusive-partition sparsifiers MiCRO and ExDyna (Yoon & Oh).

* MiCRO (HiPC 2023): ``[0, n)`` is cut into ``P`` even, contiguous
  partitions; at step ``t`` worker ``r`` owns partition ``(t + r) mod P`` and
  selects ``{i in own partition : |acc_i| >= thr}`` -- cost ``O(n/P)``, no
  sort, and no two workers ever select the same coordinate (build-up 1).
* ExDyna (CCGrid 2024): the partitions are runs of fine-grained blocks whose
  boundaries move, identically on every rank, toward the partitions that
  selected less last step, driving the imbalance
  ``P max_i k_i / sum_i k_i - 1`` toward 0.

Communication (both): allgather the index lists, allreduce every worker's own
``acc`` at all gathered indices, divide by ``P``; the residual is zeroed at
**all** gathered indices on every worker.  The threshold is estimated from the
data at the first step and then scaled online from global counts only (see
``core.threshold``: a ladder of thresholds whose per-rank counts ride in the
step's header), so all ranks agree without extra messages.

Hyper-parameters: ``density`` (0.001); ``threshold_control`` ``"adaptive"``
(default, ours) or ``"paper"``; ``initial_threshold`` ``"estimate"``
(default, ours: the exact ``k``-th magnitude) or ``"paper"`` (``1/(2 sqrt
k)``); ``allgather`` ``"exact"`` (default: each rank sends its own count)
or ``"padded"`` (every index list padded to the longest, as the papers'
equal-size NCCL allgather: imbalance then costs traffic); ExDyna's
``rebalance`` ``"proportional"`` (default, ours), ``"paper"`` or
``"none"``; ``blocks`` (1024) and ``min_blocks``, the fewest blocks a
partition keeps (default: ExDyna's ``blocks / (4P)`` with ``"paper"``, 1
with ``"proportional"``, whose data-driven cuts need the room: with
ExDyna's floor a hot region narrower than ``(P-1)/(4P)`` of the model
cannot be split evenly).  ``threshold_control``, ``initial_threshold`` and
(ExDyna) ``rebalance`` set to ``"paper"``, with ``allgather="padded"``, run
the released code's arithmetic (``core.threshold``, ``core.partition``).
"""

from dataclasses import asdict

import numpy as np

from ..partition import BlockPartition, even_bounds, owned_partition, owner_of
from ..threshold import INITIAL_THRESHOLDS, initial_threshold, make_control, \
    paper_initial_threshold
from ..arguments import check_choice, check_integer
from .base import Sparsifier, allgather_padded, average_disjoint, step_metrics

ALLGATHERS = ("exact", "padded")

_TINY = float(np.finfo(np.float32).tiny)
# The adaptive controller re-estimates from data when the count is this far off.
_REESTIMATE_RATIO = 16.0


class ExclusivePartitionSparsifier(Sparsifier):
    """Threshold selection inside a rotating exclusive partition (MiCRO's core)."""

    def __init__(self, density=0.001, threshold_control="adaptive", initial_threshold="estimate",
                 allgather="exact"):
        super().__init__(density)
        self.control = make_control(threshold_control)
        self.initial_threshold = check_choice("initial_threshold", initial_threshold,
                                              INITIAL_THRESHOLDS)
        self.allgather = check_choice("allgather", allgather, ALLGATHERS)
        self.threshold = None
        self.last_counts = None  # k_i of the last completed step ...
        self.last_step = None    # ... and which step that was
        self.mean_candidates = 0  # per rank in the last step's scans: sizes the next scan's output

    # -- partition layout (overridden by ExDyna) ------------------------------
    def partition_bounds(self, n, size, step):
        """Return ``(bounds, new_layout_state)`` for this step."""
        return even_bounds(n, size), None

    def commit_layout(self, layout_state):
        pass

    # -------------------------------------------------------------------------
    def _known_threshold(self, k):
        """This step's threshold, ``None`` while it must be measured from the data."""
        if self.threshold is None and self.last_step is None and self.initial_threshold == "paper":
            return paper_initial_threshold(k)
        return self.threshold

    def _rungs(self, threshold):
        return np.maximum(self.control.rungs(threshold), _TINY)

    def _owned(self, n, rank, size, step):
        """``((start, stop) of this rank's partition, the layout state to commit)``."""
        bounds, layout_state = self.partition_bounds(n, size, step)
        return bounds[owned_partition(step, rank, size)], layout_state

    @property
    def _expected_candidates(self):
        """This step's scan's size hint: twice the last step's mean per rank (a rank's
        own count alternates with the rotating share)."""
        return 2 * self.mean_candidates

    def scan_request(self, n, rank, size, step):
        """The candidate scan, lowest rung up over the owned partition, when the
        threshold is known before the step."""
        threshold = self._known_threshold(self.k(n))
        if threshold is None:  # measured from acc itself
            return None
        (start, stop), _ = self._owned(n, rank, size, step)
        return start, stop, self._rungs(threshold)[0], self._expected_candidates

    def exchange(self, acc, context):
        ops, n, size = context.ops, context.layout.n, context.size
        k = self.k(n)
        (start, stop), layout_state = self._owned(n, context.rank, size, context.step)
        threshold = self._known_threshold(k)
        estimating = threshold is None
        if estimating:  # measured from the data by a collective, so after the header
            context.exchange_header()
            threshold = max(initial_threshold(acc, k, start, stop, context), _TINY)
        rungs = self._rungs(threshold)
        with context.timed_selection():
            scanned = context.scanned(start, stop, rungs[0])
            if scanned is None:
                scanned = ops.abs_ge_entries(acc, rungs[0], start, stop, self._expected_candidates)
            candidates, magnitudes = scanned
            ladder = ops.count_abs_ge_each(magnitudes, rungs)
            if self.control.sends_one_when_empty and not len(candidates) and stop > start:
                first = start + context.step % (stop - start)
                candidates = ops.arange(first, first + 1, acc)
                magnitudes, ladder = ops.take(acc, candidates), [1]
        fields = [len(candidates), *ladder]
        table = (context.allgather_host(np.array(fields, dtype=np.int64)) if estimating
                 else context.exchange_header(*fields))
        totals = table[:, 1:].sum(axis=0)  # global count at every rung
        self.mean_candidates = int(table[:, 0].mean())
        chosen = self.control.choose(totals, k)
        counts = table[:, 1 + chosen]
        with context.timed_selection():
            indices = candidates if chosen == 0 else ops.select_abs_ge(candidates, magnitudes,
                                                                        rungs[chosen])
        union = (allgather_padded(context, indices, counts) if self.allgather == "padded"
                 else context.allgather_indices(indices, counts))
        aggregate = average_disjoint(context, union, acc)
        self._commit(threshold, rungs, totals, chosen, k, counts, context.step)
        self.commit_layout(layout_state)
        return aggregate, step_metrics(context, k, counts, counts.sum(), rungs[chosen])

    def _commit(self, base, rungs, ladder, chosen, k, counts, step):
        """Keep this step's counts and the next threshold, from the ladder built on
        ``base`` and the chosen rung."""
        self.last_counts, self.last_step = [int(c) for c in counts], step
        threshold = self.control.next_threshold(base, rungs, ladder, chosen, k)
        total = int(ladder[chosen])
        if self.control.reestimates and not k / _REESTIMATE_RATIO <= total <= k * _REESTIMATE_RATIO:
            self.threshold = None  # far off (or nothing selected): measure again next step
            return
        self.threshold = max(threshold, _TINY)

    def state_dict(self):
        return {"threshold": self.threshold, "last_counts": self.last_counts,
                "last_step": self.last_step, "control": self.control.state_dict()}

    def load_state_dict(self, state):
        self.threshold = state["threshold"]
        self.last_counts = state["last_counts"]
        self.last_step = state["last_step"]
        self.control.load_state_dict(state["control"])


class MiCRO(ExclusivePartitionSparsifier):
    name = "micro"

    def __repr__(self):
        return (f"MiCRO(density={self.density}, threshold_control={self.control.name!r}, "
                f"initial_threshold={self.initial_threshold!r}, allgather={self.allgather!r})")


class ExDyna(ExclusivePartitionSparsifier):
    name = "exdyna"

    def __init__(self, density=0.001, threshold_control="adaptive", rebalance="proportional",
                 blocks=1024, min_blocks=None, initial_threshold="estimate", allgather="exact"):
        super().__init__(density, threshold_control, initial_threshold, allgather)
        if rebalance not in ("paper", "proportional", "none"):
            raise ValueError("rebalance must be one of ['none', 'paper', 'proportional'], "
                             f"got {rebalance!r}")
        check_integer("blocks", blocks)
        check_integer("min_blocks", min_blocks, allow_none=True)
        if min_blocks is None and rebalance == "proportional":
            min_blocks = 1
        self.rebalance, self.blocks, self.min_blocks = rebalance, blocks, min_blocks
        self.partition = None

    def partition_bounds(self, n, size, step):
        partition = self.partition
        if partition is None or partition.n != n or partition.size != size:
            partition = BlockPartition.initial(n, size, target_blocks=self.blocks,
                                               min_blocks=self.min_blocks,
                                               exact_blocks=self.rebalance == "paper")
        elif self.last_step == step - 1:
            loads = [self.last_counts[owner_of(j, step - 1, size)] for j in range(size)]
            partition = partition.rebalanced(loads, self.rebalance)
        return partition.bounds(), partition

    def commit_layout(self, layout_state):
        self.partition = layout_state

    def state_dict(self):
        state = super().state_dict()
        state["partition"] = None if self.partition is None else asdict(self.partition)
        return state

    def load_state_dict(self, state):
        super().load_state_dict(state)
        saved = state.get("partition")
        self.partition = None if saved is None else BlockPartition.from_state(saved)

    def __repr__(self):
        return (f"ExDyna(density={self.density}, threshold_control={self.control.name!r}, "
                f"rebalance={self.rebalance!r}, blocks={self.blocks}, "
                f"min_blocks={self.min_blocks}, initial_threshold={self.initial_threshold!r}, "
                f"allgather={self.allgather!r})")
