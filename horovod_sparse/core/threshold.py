"""Magnitude-threshold control for the partition family (MiCRO, ExDyna).

Every rank derives its threshold from the same global numbers, carried by the
step's header (the small allgather every exchange starts with), so the
thresholds are identical on all ranks and no message is added.

Each step a control offers a *ladder* of candidate thresholds (rungs); every
rank counts its own ``|acc_i| >= rung`` inside its partition for each rung,
the counts travel in the header, and every rank picks the same rung from the
global counts.  The rung is used for this step's selection and seeds the next
step's ladder.  A control answers ``rungs(threshold)`` and ``choose(totals, k)``
(queries: they change nothing) and ``next_threshold(base, rungs, totals,
chosen, k)`` (the one call that updates its state, with ``base`` the threshold
the ladder was built on).

* :func:`initial_threshold` (t = 0, ``initial_threshold="estimate"``,
  default; docs/methods/threshold_control_rules.md): each rank takes the
  ``k`` largest magnitudes of the partition it owns; the ``k``-th largest of
  all ranks' candidates selects exactly ``k`` elements.  One-off cost: a
  top-k over ``n/P`` and an allgather of ``k`` values.
  :func:`paper_initial_threshold` (``"paper"``): the released code's
  ``1 / (2 sqrt(k))``, whatever the gradient's scale.
* :class:`PaperControl`: one rung, scaled after the step exactly as
  MiCRO/ExDyna's released code does: ``K/k > 1.1`` x1.005, else
  ``K/k > 0.909`` x1.00125, else x0.995 (its x0.9987 branch is unreachable).
  It follows the gradient with a lag, and inside the band it always rises.
  A rank that selects nothing sends one coordinate of its partition, as
  that code does (:attr:`PaperControl.sends_one_when_empty`).
* :class:`AdaptiveControl` (default, ours): rungs every 0.4 % (in log) from
  ``low`` times the last threshold up to twice it, plus 8 coarse rungs up
  to 4 times it; the rung whose global count is nearest ``k`` (in
  ``|log(K/k)|``) is chosen *in the same step*, so the density error is only
  the ladder's resolution (a 0.4 % threshold step moves the count by about
  ``0.4 a`` % for a tail ``K(thr) ~ thr^-a``), and a jump of the gradient
  scale within the ladder is absorbed at once.  ``low = 4 ** (-1/a)``
  (clipped to ``[0.5, 0.9]``) follows the measured exponent ``a``, bounding
  the candidates (elements above the lowest rung): a few ``k`` on moderate
  tails, ~17 ``k`` on the steep ones error feedback piles up below the
  threshold (the wide MLP of ``benchmarks/synthetic.py``; 34 ``k`` with
  ``low`` up to 0.8).  After a step whose threshold rose by ``1/fall`` the
  lowest rung is ``low * fall`` times the threshold: a spike that falls
  back below where it started (the digits run's last epochs: up 1.4-1.9x,
  then down to 0.5-0.7 of that) stays inside the ladder, which
  ``min(low, fall)`` did not hold (one step at 0.2-0.5 ``k``).
"""

import math

import numpy as np


def initial_threshold(acc, k, start, stop, context):
    """The threshold that selects exactly ``k`` elements over all ranks' owned slices.

    A collective after the step's header, which has already rejected
    non-finite gradients.
    """
    ops = context.ops
    local_k = min(k, stop - start)
    candidates = ops.take(acc, ops.topk_abs_indices(acc, local_k, start, stop))
    padded = ops.concat([candidates, ops.zeros(k - local_k, acc)])
    gathered = context.allgather(padded, [k] * context.size)
    magnitudes = np.abs(ops.to_host(gathered).astype(np.float64))
    magnitudes = magnitudes[np.isfinite(magnitudes)]
    if magnitudes.size < k:
        return 0.0
    return float(np.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])


INITIAL_THRESHOLDS = ("estimate", "paper")


def paper_initial_threshold(k):
    """MiCRO/ExDyna's released first threshold, ``1 / (2 sqrt(k))`` (also the
    hard-threshold baseline's fixed one)."""
    return 1.0 / (2.0 * math.sqrt(k))


class PaperControl:
    """MiCRO/ExDyna's multiplicative rule (one rung), as the released code runs it."""

    name = "paper"
    sends_one_when_empty = True  # a rank that selects nothing sends one coordinate
    reestimates = False          # never re-measures from the data

    def rungs(self, threshold):
        return np.array([threshold], dtype=np.float64)

    def choose(self, counts, k):
        return 0

    def next_threshold(self, base, rungs, counts, chosen, k):
        ratio = counts[chosen] / k
        threshold = rungs[chosen]
        if ratio > 1.1:
            return threshold * 1.005
        if ratio > 0.909:
            return threshold * 1.00125
        return threshold * 0.995

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class AdaptiveControl:
    """Same-step choice from a ladder of thresholds (our controller).

    Hyper-parameters: ``resolution`` (0.004, log spacing of the fine rungs),
    ``span`` (0.7: fine rungs reach ``e**span``, about twice, the last threshold),
    ``reach`` (4: 8 coarse rungs from there up to ``reach`` times it),
    ``low`` in ``[0.5, 0.9]`` (starts at 0.5: the lowest rung and candidate
    floor).  After a step whose threshold rose (a one-step spike of the
    gradient scale), the floor also reaches ``fall`` (the threshold before it
    over the one after) further down: the lowest rung is ``low * fall``
    times the last threshold.
    """

    name = "adaptive"
    sends_one_when_empty = False
    reestimates = True  # re-measures from the data after a count far from k
    resolution, span, reach, coarse = 0.004, 0.7, 4.0, 8
    low_range = (0.5, 0.9)

    def __init__(self):
        self.low = self.low_range[0]
        self.fall = 1.0  # previous / current threshold when it rose, else 1

    def rungs(self, threshold):
        floor = math.log(self.low * self.fall)
        fine = floor + self.resolution * np.arange(int((self.span - floor) / self.resolution) + 1)
        coarse = np.linspace(self.span, math.log(self.reach), self.coarse + 1)[1:]
        return threshold * np.exp(np.concatenate([fine, coarse]))

    def choose(self, counts, k):
        counts = np.asarray(counts, dtype=np.float64)
        distance = np.where(counts > 0, np.abs(np.log(np.maximum(counts, 1) / k)), np.inf)
        return int(np.argmin(distance)) if np.isfinite(distance).any() else 0

    def next_threshold(self, base, rungs, counts, chosen, k):
        low, high = self.low_range
        if chosen > 0 and counts[chosen] > 0:
            exponent = math.log(counts[0] / counts[chosen]) / math.log(rungs[chosen] / rungs[0])
            self.low = min(max(4.0 ** (-1.0 / max(exponent, 1e-3)), low), high)
        else:
            self.low = low
        chosen_threshold = float(rungs[chosen])
        self.fall = min(1.0, base / chosen_threshold)
        return chosen_threshold

    def state_dict(self):
        return {"low": self.low, "fall": self.fall}

    def load_state_dict(self, state):
        self.low, self.fall = float(state["low"]), float(state["fall"])


CONTROLS = {"paper": PaperControl, "adaptive": AdaptiveControl}


def make_control(name):
    if name not in CONTROLS:
        raise ValueError(f"threshold_control must be one of {sorted(CONTROLS)}, got {name!r}")
    return CONTROLS[name]()
