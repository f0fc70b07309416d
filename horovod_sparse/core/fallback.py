"""``fallback="auto"``: send the gradient densely where sparsification does not pay.

Sparsification trades bandwidth for selection work and extra collective
rounds.  On a fast link or a small model one allreduce of the whole gradient
is quicker, and then a sparse step only makes training slower.  With
``fallback="auto"`` the compressor times both kinds of step and runs the
faster, re-checking every ``recheck_every`` steps.  After ``warmup`` sparse
steps (first-step set-up is not timed), each cycle of ``recheck_every`` steps
runs::

    positions [0, probe)          dense, timed
    positions [probe, 2 probe)    sparse, timed
    position  2 probe             sparse: its header carries the times, all decide
    positions (2 probe, end)      the faster kind

A step's time is this rank's *period*: from the start of the step to the
start of the next, so both kinds include the same forward and backward
passes and a dense step that overlaps the backward pass is credited for it.
At the decision step every rank puts the difference of its shortest dense and
shortest sparse period (microseconds) in the step's header -- the shortest,
because a step is only ever slowed down by what else runs (another process
on the core, the first dense step after sparse ones renegotiating Horovod's
tensor sizes); all ranks read the same table, and dense wins where the mean
over ranks is negative.  Probing
costs ``probe`` dense steps per cycle where sparse wins (2 in 200 by default:
on a link where a dense step costs 5 sparse ones, 4 % of the sparse
speed-up) and ``probe + 1`` sparse steps where dense wins.

A dense step sends ``acc`` -- the gradient plus the residual (under momentum
correction, the velocity ``u = m u + g`` plus the residual) -- whole, and the
residual is then empty: what error feedback still owed is delivered in that
step, nothing is lost across a switch, and the velocity continues (momentum
SGD).  Switching back, the method resumes with an empty residual and its own
state (thresholds, partitions) as it left it.  The PyTorch compressor hands
a dense step's gradients to Horovod's own allreduce, parameter by parameter
as the backward pass produces them (``GradientExchange.begin_whole_step``);
elsewhere (TensorFlow, a method with local clipping) :class:`DenseStep`
allreduces ``acc`` in one piece inside the exchange.
"""

import statistics

from .metrics import StepMetrics
from .methods.base import check_positive_int

FALLBACKS = (None, "auto")


class DenseStep:
    """One exchange that sends every coordinate: the step ``fallback`` switches to."""

    name = "dense"

    def exchange(self, acc, context):
        n = context.layout.n
        context.exchange_header()
        aggregate = context.new_aggregate()
        context.ops.add_slice(aggregate, aggregate, context.reduced(context.allreduce_values(acc)),
                              0, n)
        context.flush()
        return aggregate, StepMetrics(step=context.step, n=n, k=n, counts=[n] * context.size,
                                      nnz=n, extra={"fallback": True})


class AutoFallback:
    """The schedule and the decision of ``fallback="auto"`` (see the module text).

    Parameters
    ----------
    probe : timed steps of each kind per cycle (default 2).
    recheck_every : cycle length in steps (default 200).
    warmup : untimed sparse steps at the start (default 3).
    """

    def __init__(self, probe=2, recheck_every=200, warmup=3):
        self.probe = check_positive_int("probe", probe)
        self.recheck_every = check_positive_int("recheck_every", recheck_every)
        self.warmup = check_positive_int("warmup", warmup + 1) - 1  # 0 allowed
        if self.recheck_every <= 2 * self.probe + 1:
            raise ValueError(f"recheck_every ({recheck_every}) must exceed 2 * probe + 1 "
                             f"({2 * probe + 1})")
        self.choice = "sparse"
        self._periods = {"sparse": [], "dense": []}

    def __repr__(self):
        return (f"AutoFallback(probe={self.probe}, recheck_every={self.recheck_every}, "
                f"warmup={self.warmup})")

    def _position(self, step):
        return None if step < self.warmup else (step - self.warmup) % self.recheck_every

    def kind(self, step):
        """``"sparse"`` or ``"dense"`` for step ``step``."""
        position = self._position(step)
        if position is None:
            return "sparse"
        if position < self.probe:
            return "dense"
        return "sparse" if position <= 2 * self.probe else self.choice

    def record_period(self, step, seconds):
        """This rank's period of step ``step`` (known when the next one starts)."""
        position = self._position(step)
        if position is None or position >= 2 * self.probe:
            return
        if position == 0:
            self._periods = {"sparse": [], "dense": []}
        self._periods[self.kind(step)].append(seconds)

    def announcement(self, step):
        """What this rank puts in step ``step``'s header: at the decision step its
        shortest dense minus shortest sparse period in microseconds, else 0."""
        if self._position(step) != 2 * self.probe:
            return 0
        dense, sparse = (min(self._periods[k]) for k in ("dense", "sparse"))
        return round(1e6 * (dense - sparse))

    def decide(self, step, announced):
        """Every rank's announcement of step ``step`` (from its header): at the
        decision step, dense if they say so on average."""
        if self._position(step) == 2 * self.probe:
            self.choice = "dense" if statistics.fmean(announced.tolist()) < 0 else "sparse"


def create_fallback(fallback):
    """The policy object for a ``fallback`` argument (``None``: no fallback)."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    return AutoFallback() if fallback == "auto" else None
