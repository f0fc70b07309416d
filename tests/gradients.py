"""Deterministic test gradients, reproducible on any rank from (seed, step, rank)."""

import numpy as np

# A small "model": tensor shapes of mixed sizes (one over n/P, several tiny).
SHAPES = [(40, 30), (30,), (30, 20), (20,), (64, 9), (1,), (3, 5)]


def sizes(shapes=SHAPES):
    return [int(np.prod(s)) for s in shapes]


def dyadic_gradient(seed, step, rank, shapes=SHAPES, skew=False):
    """Heavy-tailed (Student-t, 3 dof) float32 values on the grid 2**-8, |g| <= 64.

    Each tensor gets its own power-of-two scale; with ``skew`` the first
    fifth of the flat vector is 8x larger (ExDyna's imbalance scenario).
    All values are dyadic, so float32 sums of a few of them are exact in any order.
    """
    rng = np.random.default_rng([seed, step, rank])
    parts = []
    for index, shape in enumerate(shapes):
        n = int(np.prod(shape))
        scale = 2.0 ** ((index % 3) - 1)
        values = np.clip(np.round(rng.standard_t(3, n) * 64 * scale), -2 ** 14, 2 ** 14) / 256
        parts.append(values.astype(np.float32))
    flat = np.concatenate(parts)
    if skew:
        flat[: flat.size // 5] *= 8
    return flat


def split(flat, shapes=SHAPES):
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[offset:offset + n].reshape(shape))
        offset += n
    return out


def stream(seed, steps, size, shapes=SHAPES, skew=False):
    """``grads[t][r]`` for ``steps`` steps of ``size`` workers."""
    return [[dyadic_gradient(seed, t, r, shapes, skew) for r in range(size)] for t in range(steps)]
