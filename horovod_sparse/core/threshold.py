"""Magnitude-threshold control for the partition family (MiCRO, ExDyna).

Every rank updates the threshold from the same global numbers of the last
step (total count ``K = sum_i k_i`` and ``K_probe``, the number of selected
elements with ``|acc| >= (1 + probe) * thr``, both carried by the step's
header), so thresholds stay identical on all ranks with no extra message.

* :func:`initial_threshold` (t = 0, the Decision of ALGORITHMS.md): each
  rank takes the ``k`` largest magnitudes of the partition it owns; the
  ``k``-th largest of all ranks' candidates is exactly the threshold that
  selects ``k`` elements at t = 0.  One-off cost: a top-k over ``n/P`` and an
  allgather of ``k`` values.
* :class:`PaperControl`: the multiplicative rule of MiCRO/ExDyna's released
  code, with our Decision for the dead band (x1.00125 above, x0.9987 below).
* :class:`AdaptiveControl` (default): a Newton step on ``log K`` vs
  ``log thr``.  Around the threshold the count behaves like
  ``K(thr) ~ thr^(-a)``; the probe count gives the local exponent
  ``a = log(K / K_probe) / log(1 + probe)`` and the update
  ``thr *= (K / k) ** (1 / a)`` removes the density error in one step if the
  gradient did not change, and follows a change of scale (a learning-rate
  drop) within a few steps.  Factors are clipped to ``[1/4, 4]``.
"""

import math

import numpy as np


def initial_threshold(acc, k, start, stop, context):
    """The threshold that selects exactly ``k`` elements over all ranks' owned slices.

    Non-finite magnitudes are ignored here (the step's header rejects them).
    """
    ops, comm = context.ops, context.comm
    local_k = min(k, stop - start)
    candidates = ops.take(acc, ops.topk_abs_indices(acc, local_k, start, stop))
    padded = ops.concat([candidates, ops.zeros(k - local_k, acc)])
    with context.timed_communication():
        gathered = comm.allgather(padded, [k] * comm.size)
    magnitudes = np.abs(ops.to_host(gathered).astype(np.float64))
    magnitudes = magnitudes[np.isfinite(magnitudes)]
    if magnitudes.size < k:
        return 0.0
    return float(np.partition(magnitudes, magnitudes.size - k)[magnitudes.size - k])


class PaperControl:
    """MiCRO/ExDyna's rule: ``r = K/k``; x1.005 above 1.1, x0.995 below 1/1.1,
    and inside the band x1.00125 when ``r > 1``, x0.9987 when ``r < 1``."""

    name = "paper"
    probe = 0.0

    def update(self, threshold, total, probe_count, k):
        ratio = total / k
        if ratio > 1.1:
            return threshold * 1.005
        if ratio < 1 / 1.1:
            return threshold * 0.995
        if ratio > 1:
            return threshold * 1.00125
        if ratio < 1:
            return threshold * 0.9987
        return threshold


class AdaptiveControl:
    """Newton step in log-log space with a measured tail exponent (our controller).

    Hyper-parameters: ``probe`` (0.1) places the probe count at
    ``(1 + probe) * thr``; ``default_exponent`` (2.0) is used when the probe
    count says nothing (no element, or all, above the probe); the exponent is
    clipped to ``[0.5, 50]`` and the factor to ``[1/4, 4]``.
    """

    name = "adaptive"

    def __init__(self, probe=0.1, default_exponent=2.0):
        self.probe, self.default_exponent = probe, default_exponent

    def update(self, threshold, total, probe_count, k):
        if total == 0:
            return threshold / 4
        if 0 < probe_count < total:
            exponent = math.log(total / probe_count) / math.log(1 + self.probe)
        else:
            exponent = self.default_exponent
        exponent = min(max(exponent, 0.5), 50.0)
        factor = (total / k) ** (1.0 / exponent)
        return threshold * min(max(factor, 0.25), 4.0)


CONTROLS = {"paper": PaperControl, "adaptive": AdaptiveControl}


def make_control(name):
    if name not in CONTROLS:
        raise ValueError(f"threshold_control must be one of {sorted(CONTROLS)}, got {name!r}")
    return CONTROLS[name]()
