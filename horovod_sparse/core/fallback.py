"""``fallback="auto"``: send the gradient densely where sparsification does not pay.

Sparsification trades bandwidth for selection work and extra collective
rounds.  On a fast link or a small model one allreduce of the whole gradient
is quicker, and then a sparse step only makes training slower.  With
``fallback="auto"`` the exchange measures both kinds of step and runs the
faster, re-checking every ``recheck_every`` steps.  After ``warmup`` sparse
steps (first-step set-up is not timed), each cycle of ``recheck_every`` steps
runs::

    positions [0, probe)          sparse, timed
    positions [probe, 2 probe)    dense, timed
    position  2 probe             the previous decision (sparse at first)
    positions (2 probe, end)      the faster kind by median step time

A step's time is this rank's wall time in the exchange (accumulation,
selection, collectives).  Every step's header carries each rank's time of its
*previous* step, so all ranks read the same table and take the same
decision; a step's kind is therefore fixed from times up to two steps back,
hence the one step on the previous decision.  The time of a step is the mean
over ranks.  Probing costs ``probe`` dense steps per cycle where sparse wins
(2 in 200 by default: on a link where a dense step costs 5 sparse ones,
4 % of the sparse speed-up) and ``probe + 1`` sparse steps where dense wins.

A dense step (:class:`DenseStep`) allreduces ``acc`` -- the gradient plus the
residual (under momentum correction, the velocity plus the residual) -- whole
and empties the residual: what error feedback still owed is delivered in that
step, nothing is lost across a switch, and the velocity continues (momentum
SGD).  Switching back, the method resumes with an empty residual and its own
state (thresholds, partitions) as it left it.
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
        self._times = {"sparse": [], "dense": []}

    def __repr__(self):
        return (f"AutoFallback(probe={self.probe}, recheck_every={self.recheck_every}, "
                f"warmup={self.warmup})")

    def _position(self, step):
        return None if step < self.warmup else (step - self.warmup) % self.recheck_every

    def kind(self, step):
        """``"sparse"`` or ``"dense"`` for step ``step``."""
        position = self._position(step)
        if position is None or position < self.probe:
            return "sparse"
        if position < 2 * self.probe:
            return "dense"
        return self.choice

    def observe(self, step, seconds):
        """Every rank's time of step ``step`` (from the header of the step after it)."""
        position = self._position(step)
        if position is None or position >= 2 * self.probe:
            return
        if position == 0:
            self._times = {"sparse": [], "dense": []}
        self._times[self.kind(step)].append(statistics.fmean(seconds))
        if position == 2 * self.probe - 1:
            sparse, dense = (statistics.median(self._times[k]) for k in ("sparse", "dense"))
            self.choice = "dense" if dense < sparse else "sparse"


def create_fallback(fallback):
    """The policy object for a ``fallback`` argument (``None``: no fallback)."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    return AutoFallback() if fallback == "auto" else None
