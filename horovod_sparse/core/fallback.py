"""``fallback="auto"``: send the gradient densely where sparsification does not pay.

Sparsification trades bandwidth for selection work and extra collective
rounds.  On a fast link or a small model one allreduce of the whole gradient
is quicker, and then a sparse step only makes training slower.  With
``fallback="auto"`` the compressor times both kinds of step and runs the
faster.  After ``warmup`` untimed sparse steps (the first steps' set-up, and
ranks still starting), each *check* runs::

    1 + probe steps       sparse; the first untimed
    1 + probe steps       dense; the first untimed (it pays the switch: the
                          residual sent, Horovod meeting new tensors)
    at the next start     every rank reports its shortest timed period of
                          each kind in whole microseconds (one allreduce of
                          two integers: exact in any order); all decide alike

and the faster kind runs until the next check.  A check that needs
confirming -- the first when it finds sparse faster, a later one that finds
the other kind faster -- brings the next check to ``max(2 (1 + probe),
recheck_every / 4)`` steps after its start, and the choice (a later one's:
the change) holds only when that one agrees.  (One burst of load from
elsewhere can make both timed steps of a kind slow; on the digits MLP such a
check once chose sparse steps that cost 3x dense ones for the next 200 steps,
and a first check at 2 ranks chose CLT-k's 2.8x dense sparse steps once in 50
runs.  Only a sparse first choice is confirmed: dense is what Horovod does
without the compressor, so a wrong dense choice only forgoes a speed-up,
while a wrong sparse one makes training slower than without the compressor.)

A step's time is this rank's *period*, from the start of the step to the
start of the next, so both kinds include the same forward and backward passes
and a dense step that overlaps the backward pass is credited for it.  Each
kind counts its shortest period, because a step is only ever slowed down by
what else runs (another process on the core, a rank still catching up); the
ranks' means ``D`` (dense) and ``S`` (sparse) decide: dense where ``D < S``.

The next check comes ``L`` steps after this one started, where ``L`` keeps
probing the losing kind within ``probe_cost`` of the training time::

    L = max(recheck_every, (1 + probe) |D - S| / (probe_cost min(D, S)))

On the digits MLP at one host, where a sparse step costs 3-8 dense ones, the
next check is 600-2,100 steps away; across a 1 Gbit/s link, where a dense
step costs 4 sparse ones, ~900.  A close call re-checks after
``recheck_every`` steps.

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

Once the residual is empty the gradients travel as they are (a *plain*
step, what ``hvd.Compression.none`` sends).  Under momentum correction
(averaged, without Nesterov, no frozen parameter) PyTorch's whole step that
starts with an empty residual sends the velocities alone, so its aggregate
is their mean ``U``; every rank adopts it, and from then on ``U = m U +
mean(g)`` is applied to each averaged gradient
(``GradientExchange.begin_plain_step``).  A sparse
step resumes with ``U`` on every rank: the ranks' mean velocity, all the
aggregate ever sees, is unchanged.  (Each rank running its own ``u = m u + g``
instead costs a copy and a compiled call per gradient and a whole Horovod
cycle on a small model: DGC's dense steps ran 1.5x dense's, now ~1.1x.)
"""

import math

import numpy as np

from .metrics import StepMetrics
from .arguments import check_integer, check_number

FALLBACKS = (None, "auto")
KINDS = ("sparse", "dense")


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

    Steps are counted from this object's first (a resumed run warms up again).
    The exchange calls :meth:`begin_step` at every step's start, reads
    :attr:`kind`, and at a decision (``begin_step`` returned the report) sums
    the report over the ranks and passes it to :meth:`decide`.

    Parameters
    ----------
    probe : timed steps of each kind per check (default 2), each kind's
        block starting with one untimed step.
    recheck_every : fewest steps from one check to the next (default 200).
    probe_cost : the share of the training time probing may cost (default 0.01).
    warmup : untimed sparse steps at the start (default 10).
    """

    def __init__(self, probe=2, recheck_every=200, probe_cost=0.01, warmup=10):
        self.probe = check_integer("probe", probe)
        self.recheck_every = check_integer("recheck_every", recheck_every)
        self.warmup = check_integer("warmup", warmup, minimum=0)
        self.block = self.probe + 1  # steps of each kind per check
        if self.recheck_every <= 2 * self.block:
            raise ValueError(f"recheck_every ({recheck_every}) must exceed 2 * (probe + 1) "
                             f"({2 * self.block})")
        self.probe_cost = check_number("probe_cost", probe_cost, 0.0, 1.0, closed=(False, False))
        self.confirm_after = max(2 * self.block, self.recheck_every // 4)  # steps to a confirming check
        self.choice = "sparse"
        self.decided = False       # the first check has decided
        self.confirming = False    # the next check's finding holds as it is
        self.step = -1             # the step in progress (-1: none yet)
        self.check = self.warmup   # the step the next check starts at
        self._periods = {kind: [] for kind in KINDS}

    def __repr__(self):
        return (f"AutoFallback(probe={self.probe}, recheck_every={self.recheck_every}, "
                f"probe_cost={self.probe_cost}, warmup={self.warmup})")

    def _kind_of(self, step):
        position = step - self.check
        if step < self.warmup:
            return "sparse"
        if not 0 <= position < 2 * self.block:
            return self.choice
        return "sparse" if position < self.block else "dense"

    @property
    def kind(self):
        """``"sparse"`` or ``"dense"``: the kind of the step in progress."""
        return self._kind_of(self.step)

    def begin_step(self, last_period):
        """A step starts; ``last_period``: this rank's period of the step before
        (seconds; ``None`` for the first).  Returns ``None``, or at a decision
        this rank's report ``[shortest dense, shortest sparse period]`` (int64
        microseconds) for the exchange to sum over the ranks."""
        position = self.step - self.check
        if 0 <= position < 2 * self.block and position % self.block:  # a timed probe step
            self._periods[self._kind_of(self.step)].append(last_period)
        self.step += 1
        if self.step - self.check != 2 * self.block:
            return None
        report = np.rint(1e6 * np.array([min(self._periods["dense"]),
                                         min(self._periods["sparse"])])).astype(np.int64)
        self._periods = {kind: [] for kind in KINDS}
        return report

    def decide(self, summed, size):
        """The ranks' summed reports: dense where the mean shortest dense period is
        the shorter.  The next check comes ``L`` steps after this one's start, or
        :attr:`confirm_after` steps where this one needs confirming: a sparse
        first choice (it runs meanwhile, and the confirming check decides alone)
        or a change of choice (it waits for the confirming check's agreement)."""
        dense, sparse = summed[0] / size, summed[1] / size
        faster = "dense" if dense < sparse else "sparse"
        change = faster != self.choice and self.decided and not self.confirming
        if not change:
            self.confirming = faster == "sparse" and not self.decided  # a sparse first choice
            self.choice, self.decided = faster, True
        else:
            self.confirming = True
        if self.confirming:
            self.check += self.confirm_after
            return
        shorter = min(dense, sparse)
        budget = (self.block * abs(dense - sparse) / (self.probe_cost * shorter)
                  if shorter > 0 else 0)
        self.check += max(self.recheck_every, math.ceil(budget))


def create_fallback(fallback):
    """The policy object for a ``fallback`` argument (``None``: no fallback)."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    return AutoFallback() if fallback == "auto" else None
