"""Deep Gradient Compression (Lin et al., "Deep Gradient Compression", ICLR 2018).

Per rank and step ``t``:

1. optional local gradient clipping, ``||g|| <= clip_norm / sqrt(P)``;
2. momentum correction ``u = m u + g``, ``v = v + u`` (``acc = v``);
3. threshold from a random sample of ``sample_ratio * n`` elements of
   ``|acc|`` (drawn from ``(seed, t, rank)``): its ``ceil(d_t * samples)``-th
   largest magnitude; select ``|acc| >= thr``;
4. if that overshoots ``overshoot * k`` (default 1.3), keep the exact top-``k``
   of the selected elements;
5. allgather (indices, values), add in rank order, divide by ``P``; zero
   ``u`` and ``v`` at this rank's own selection (factor masking).

Sparsity warm-up: with ``warmup_steps = s > 0`` the density is
``max(density, warmup_densities[t // s])`` for the first
``s * len(warmup_densities)`` steps (the paper's 75 %, 93.75 %, 98.4375 %,
99.6 % sparsity, one stage per epoch: pass the steps per epoch).
Selection ``O(n)`` plus a top-k of the overshoot; traffic ``2k`` sent and
``2k(P-1)`` received; build-up up to ``P``.  With ``momentum > 0`` the
optimizer itself must not add momentum again (use plain SGD).
"""

import math

import numpy as np

from .base import (Sparsifier, check_momentum, average_gathered, check_density, check_positive, check_seed,
                   step_metrics)


class DGC(Sparsifier):
    name = "dgc"

    def __init__(self, density=0.001, momentum=0.9, sample_ratio=0.01, overshoot=1.3,
                 clip_norm=None, warmup_steps=0,
                 warmup_densities=(0.25, 0.0625, 0.015625, 0.004), seed=0):
        super().__init__(density)
        self.momentum = check_momentum(momentum)
        self.sample_ratio = check_positive("sample_ratio", sample_ratio, upper=1.0)
        self.overshoot = check_positive("overshoot", overshoot)
        if self.overshoot < 1:
            raise ValueError(f"overshoot must be >= 1, got {overshoot!r}")
        self.clip_norm = check_positive("clip_norm", clip_norm, allow_none=True)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps
        self.warmup_densities = tuple(check_density(d) for d in warmup_densities)
        self.seed = check_seed(seed)

    def density_at(self, step):
        """The warm-up schedule's density at ``step``."""
        if self.warmup_steps and step < self.warmup_steps * len(self.warmup_densities):
            return max(self.density, self.warmup_densities[step // self.warmup_steps])
        return self.density

    def exchange(self, acc, context):
        ops, n = context.ops, context.layout.n
        density = self.density_at(context.step)
        k = max(1, math.floor(density * n))
        with context.timed_selection():
            threshold = self.sampled_threshold(acc, context, density)
            indices = ops.abs_ge_indices(acc, threshold, 0, n)
            if len(indices) > self.overshoot * k:
                selected = ops.take(acc, indices)
                indices = ops.take(indices, ops.topk_abs_indices(selected, k, 0, len(indices)))
            values = ops.take(acc, indices)
        counts = context.exchange_header(len(indices))[:, 0]
        aggregate, gathered = average_gathered(context, indices, values, counts)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered), threshold)

    def sampled_threshold(self, acc, context, density):
        """The ``ceil(density * s)``-th largest ``|acc|`` among ``s`` sampled elements."""
        n = context.layout.n
        samples = min(n, max(1, math.ceil(self.sample_ratio * n)))
        positions = np.random.default_rng([self.seed, context.step, context.rank]).integers(
            0, n, samples)
        sampled = np.abs(context.ops.to_host(context.ops.take(acc, context.ops.from_host(
            positions, acc))))
        rank_in_sample = max(1, math.ceil(density * samples))
        return float(np.sort(sampled)[::-1][rank_in_sample - 1])

    def __repr__(self):
        return (f"DGC(density={self.density}, momentum={self.momentum}, "
                f"sample_ratio={self.sample_ratio}, overshoot={self.overshoot}, "
                f"clip_norm={self.clip_norm}, warmup_steps={self.warmup_steps}, seed={self.seed})")
