"""Deep Gradient Compression (Lin et al., "Deep Gradient Compression", ICLR 2018).

Per rank and step ``t``:

1. optional local gradient clipping, ``||g|| <= clip_norm / sqrt(P)``;
2. momentum correction ``u = m u + g``, ``v = v + u`` (``acc = v``);
   ``nesterov=True``: ``v = v + m u + g`` (the released code's ``mmt = m (mmt +
   g)``, ``v = v + mmt + g``, with ``mmt = m u``);
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
optimizer itself must not add momentum again (use plain SGD, or
``horovod_sparse.torch.DGCSGD``, whose momentum moves the weight decay only).

``variant="paper"`` runs the authors' released compressor
(synxlin/deep-gradient-compression) instead of one threshold for the model:

* every tensor of more than one dimension is compressed on its own, with
  ``k_T = ceil(d numel)``; one-dimensional tensors (biases, norm scales) are
  averaged densely (the exchange's dense part: their velocity ``u = m u + g``
  is averaged, which is the released code's momentum applied after the
  average, by linearity);
* samples: every ``s``-th ``|acc|`` from a random start in ``[0, s)``, at
  least ``max(ceil(max(sample_ratio, 1 %) numel), ceil(2 / d))`` of them
  (:func:`sample_plan`; a tensor of at most ``ceil(2 / d)`` elements is read
  whole); the threshold is their ``ceil(d * samples)``-th largest;
* above ``overshoot * k_T`` selected: the exact top-``k_T`` of the selection;
  below ``0.8 k_T``: the threshold times 0.8 and select again, at most 10
  times; then the first ``k_T`` selected by index.

Ties of the exact top-``k_T`` go to the lower index (the released code's
``torch.topk`` leaves them unspecified), and the random start comes from
``default_rng([seed, t, rank, j])`` for the ``j``-th compressed tensor.
``clip_norm`` clips the rank's whole gradient (the released memory clips
tensor by tensor).
"""

import math

import numpy as np

from ..arguments import (check_bool, check_choice, check_density, check_integer, check_momentum,
                         check_number)
from .base import Sparsifier, average_gathered, step_metrics

VARIANTS = ("model", "paper")
# The released code's sampling and undershoot rule (variant="paper").
PAPER_MIN_SAMPLE_RATIO = 0.01
PAPER_UNDERSHOOT = 0.8
PAPER_ADAPTATIONS = 10


def sample_plan(numel, density, sample_ratio):
    """The released code's sampling of one tensor: ``(k_T, samples, k_samples,
    stride)`` -- the elements to select, how many samples, the sample rank of the
    threshold and the stride between samples."""
    ratio = min(max(sample_ratio, PAPER_MIN_SAMPLE_RATIO), 1.0)
    stride, samples = 1, numel
    if ratio < 1.0:
        wanted = max(math.ceil(numel * ratio), math.ceil(2 / density))
        if numel > math.ceil(2 / density):
            stride = math.ceil(numel / wanted / 32) * 32 + 1
            samples = numel // stride
            while samples < wanted:
                stride -= 8
                samples = numel // stride
    return math.ceil(numel * density), samples, math.ceil(samples * density), stride


class DGC(Sparsifier):
    name = "dgc"

    def __init__(self, density=0.001, momentum=0.9, sample_ratio=0.01, overshoot=1.3,
                 clip_norm=None, warmup_steps=0,
                 warmup_densities=(0.25, 0.0625, 0.015625, 0.004), seed=0, variant="model",
                 nesterov=False):
        super().__init__(density)
        self.nesterov = check_bool("nesterov", nesterov)
        self.variant = check_choice("variant", variant, VARIANTS)
        self.momentum = check_momentum(momentum)
        if nesterov and not self.momentum:
            raise ValueError("nesterov=True needs momentum > 0")
        self.sample_ratio = check_number("sample_ratio", sample_ratio, high=1.0)
        self.overshoot = check_number("overshoot", overshoot)
        if self.overshoot < 1:
            raise ValueError(f"overshoot must be >= 1, got {overshoot!r}")
        self.clip_norm = check_number("clip_norm", clip_norm, allow_none=True)
        self.warmup_steps = check_integer("warmup_steps", warmup_steps, minimum=0)
        self.warmup_densities = tuple(check_density(d) for d in warmup_densities)
        self.seed = check_integer("seed", seed, minimum=0)

    @property
    def dense_1d(self):
        """The paper variant sends 1-D tensors densely (the exchange's dense part)."""
        return self.variant == "paper"

    def density_at(self, step):
        """The warm-up schedule's density at ``step``."""
        if self.warmup_steps and step < self.warmup_steps * len(self.warmup_densities):
            return max(self.density, self.warmup_densities[step // self.warmup_steps])
        return self.density

    def exchange(self, acc, context):
        if self.variant == "paper":
            return self.exchange_per_tensor(acc, context)
        ops, n = context.ops, context.layout.n
        density = self.density_at(context.step)
        k = max(1, math.floor(density * n))
        with context.timed_selection():
            threshold = self.sampled_threshold(acc, context, density)
            indices, values = ops.abs_ge_entries(acc, threshold, 0, n, 2 * k)
            if len(indices) > self.overshoot * k:
                chosen = ops.topk_abs_indices(values, k, 0, len(indices))
                indices, values = ops.take(indices, chosen), ops.take(values, chosen)
        counts = context.exchange_header(len(indices))[:, 0]
        aggregate, gathered = average_gathered(context, indices, values, counts)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered), threshold)

    def exchange_per_tensor(self, acc, context):
        """``variant="paper"``: each tensor selected on its own (see the module text)."""
        ops, layout = context.ops, context.layout
        density = self.density_at(context.step)
        plans = [sample_plan(stop - start, density, self.sample_ratio)
                 for start, stop in layout.bounds]
        with context.timed_selection():
            indices = ops.concat([
                self.select_tensor(acc, start, stop, plan, ops,
                                   np.random.default_rng([self.seed, context.step, context.rank,
                                                          position]))
                for position, ((start, stop), plan) in enumerate(zip(layout.bounds, plans))])
            values = ops.take(acc, indices)
        counts = context.exchange_header(len(indices))[:, 0]
        aggregate, gathered = average_gathered(context, indices, values, counts)
        k = sum(plan[0] for plan in plans)
        return aggregate, step_metrics(context, k, counts, ops.count_unique(gathered))

    def select_tensor(self, acc, start, stop, plan, ops, rng):
        """The released code's selection in ``acc[start:stop]`` under ``plan``
        (:func:`sample_plan`); global indices, ascending."""
        numel = stop - start
        k, samples, k_samples, stride = plan
        if numel == 0:
            return ops.arange(start, start, acc)
        first = start if samples == numel else start + int(rng.integers(0, stride))
        positions = ops.from_host(np.arange(first, stop, stride, dtype=np.int64), acc)
        sampled = np.abs(ops.to_host(ops.take(acc, positions)))
        threshold = np.partition(sampled, sampled.size - k_samples)[sampled.size - k_samples]
        indices = ops.abs_ge_indices(acc, threshold, start, stop)
        for _ in range(PAPER_ADAPTATIONS if numel > samples else 0):
            if len(indices) > self.overshoot * k:
                chosen = ops.topk_abs_indices(ops.take(acc, indices), k, 0, len(indices))
                return ops.take(indices, chosen)  # ascending: the exact top-k
            if len(indices) >= PAPER_UNDERSHOOT * k:
                break
            threshold = threshold * np.float32(PAPER_UNDERSHOOT)
            indices = ops.abs_ge_indices(acc, threshold, start, stop)
        return indices[:k]

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
                f"clip_norm={self.clip_norm}, warmup_steps={self.warmup_steps}, seed={self.seed}"
                + (f", variant={self.variant!r}" if self.variant != "model" else "")
                + (", nesterov=True)" if self.nesterov else ")"))
