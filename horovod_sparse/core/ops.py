"""Array operations the sparsifiers need, behind one small interface.

The core never imports a deep-learning framework: every per-element operation
on a gradient-sized vector goes through an :class:`ArrayOps` object, so it
runs in the framework on the tensor's own device (a CUDA gradient never leaves
the GPU).  Only small control data (counts, thresholds, layouts) lives on the
host as numpy arrays and Python numbers.

Conventions shared by every implementation:

* vectors are 1-D; index vectors are int64 and hold *global* positions;
* ``zeros`` and ``from_host`` return writable buffers (``zero_at``,
  ``scatter_add`` and ``add_slice`` update them in place);
* thresholds are compared in the vector's own precision (float32 for
  float32 gradients);
* ``topk_abs_indices`` breaks ties toward the lower index, so every framework
  (and the numpy references in ``tests/``) selects the same set;
* the sparsifiers call ``scatter_add`` with unique indices, which keeps
  their sums deterministic on every device (no atomic-add ordering); only
  the generic Count Sketch encode adds at repeated positions.
"""

import abc

import numpy as np

from . import kernels

SAMPLE = 1 << 16  # magnitudes sampled to estimate the k-th largest in :func:`topk_abs`


def exact_topk_abs(x, k, start, stop):
    """Reference selection: the ``k`` largest ``|x[i]|`` in ``[start, stop)`` (global,
    ascending indices), ties at the ``k``-th magnitude broken toward the lower
    index.  ``O(m)`` by ``np.partition`` over all ``m = stop - start`` magnitudes."""
    magnitude = np.abs(x[start:stop])
    if k >= magnitude.size:
        return np.arange(start, stop, dtype=np.int64)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    kth = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
    return _above_then_lowest_tied(np.arange(start, stop, dtype=np.int64), magnitude, kth, k)


def _above_then_lowest_tied(positions, magnitude, kth, k):
    """``positions`` (ascending) whose magnitude is above ``kth``, then the lowest
    of those equal to it, ``k`` in all, ascending."""
    above = magnitude > kth
    tied = np.flatnonzero(magnitude == kth)[:k - int(above.sum())]
    above[tied] = True
    return positions[above]


def topk_abs(x, k, start, stop, sample=SAMPLE):
    """The same indices as :func:`exact_topk_abs`, in about one read of the range.

    A strided sample of ``sample`` magnitudes estimates a threshold ``t`` a
    little below the ``k``-th largest; one scan collects every ``|x_i| >= t``
    (:func:`kernels.abs_ge_entries`), and the exact selection runs among
    those candidates only.  It is exact whenever there are at least ``k``
    candidates, since then every element of the top ``k`` (and every tie at
    the ``k``-th magnitude) is one; with fewer (an unlucky sample) the
    threshold is lowered and the scan repeated, and the full selection is the
    last resort.  Non-finite elements are never candidates (the step that has
    them is refused anyway)."""
    size = stop - start
    if k <= 0 or k >= size or size < 4 * sample or k > size // 16:
        return exact_topk_abs(x, k, start, stop)
    stride = size // sample
    magnitudes = np.abs(x[start:start + stride * sample:stride])
    expected = k * sample / size  # sample elements expected in the top k
    rank = int(1.25 * expected + 4 * np.sqrt(expected) + 8)  # a margin of about 4 sigma
    while rank < sample // 4:
        threshold = np.partition(magnitudes, sample - rank)[sample - rank]
        # about rank * stride candidates; room for twice that
        candidates, values = kernels.abs_ge_entries(x, threshold, start, stop, 2 * rank * stride)
        if candidates.size >= k:
            magnitude = np.abs(values)
            kth = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
            return _above_then_lowest_tied(candidates, magnitude, kth, k)
        rank *= 4
    return exact_topk_abs(x, k, start, stop)


class ArrayOps(abc.ABC):
    """Interface; see :class:`NumpyOps` for the reference semantics.

    A backend implements the primitives (the abstract methods: a backend that
    lacks one cannot be instantiated); every other operation has a default
    written with them, which a backend overrides only to be faster.
    """

    # -- primitives: every backend implements these --------------------------------

    @abc.abstractmethod
    def zeros(self, n, like):
        """``n`` float32 zeros on ``like``'s device (whatever ``like``'s dtype)."""

    @abc.abstractmethod
    def arange(self, start, stop, like):
        """int64 ``[start, stop)`` on ``like``'s device."""

    @abc.abstractmethod
    def from_host(self, array, like):
        """A vector on ``like``'s device holding the numpy ``array``."""

    @abc.abstractmethod
    def to_host(self, x):
        """A numpy copy of a (small) vector."""

    @abc.abstractmethod
    def astype(self, x, dtype):
        """``x`` cast to ``dtype`` (a numpy dtype name: ``"float16"`` for the wire,
        ``"int32"`` for narrow indices and back)."""

    @abc.abstractmethod
    def take(self, x, indices):
        """``x[indices]`` (a new vector)."""

    @abc.abstractmethod
    def scatter_add(self, dense, indices, values):
        """``dense[indices] += values`` in place, repeated indices summed."""

    @abc.abstractmethod
    def zero_at(self, x, indices):
        """``x[indices] = 0`` in place."""

    @abc.abstractmethod
    def concat(self, vectors):
        """The vectors joined end to end."""

    @abc.abstractmethod
    def scale_add_slice(self, out, x, factor, y, start, stop):
        """``out[start:stop] = factor * x[start:stop] + y`` in place (two roundings, no FMA)."""

    @abc.abstractmethod
    def copy_slice(self, out, x, start, stop):
        """``out[start:stop] = x`` in place (``x`` may be a view of that slice)."""

    @abc.abstractmethod
    def multiply(self, x, factor):
        """``x * factor`` (a new vector; ``factor`` a number or a vector of ``x``'s length)."""

    @abc.abstractmethod
    def divide(self, x, divisor):
        """``x / divisor`` (a new vector)."""

    @abc.abstractmethod
    def abs_ge_indices(self, x, threshold, start, stop):
        """Global indices ``i`` in ``[start, stop)`` with ``|x[i]| >= threshold``."""

    @abc.abstractmethod
    def topk_abs_indices(self, x, k, start, stop):
        """Global indices of the ``k`` largest ``|x[i]|`` in ``[start, stop)``, ascending."""

    @abc.abstractmethod
    def unique(self, indices):
        """The distinct ``indices``, ascending."""

    @abc.abstractmethod
    def merge_sum(self, indices_a, values_a, indices_b, values_b):
        """Union of two sparse vectors: (ascending distinct indices, values summed per index)."""

    @abc.abstractmethod
    def segment_sq_norms(self, x, bounds):
        """Squared L2 norms (float64, host) of ``x[s:e]`` for each ``(s, e)``."""

    @abc.abstractmethod
    def median_rows(self, rows):
        """Elementwise lower median of equally long vectors (the middle one for an odd count)."""

    # -- derived operations: defaults from the primitives --------------------------

    def add_slice(self, out, a, b, start, stop):
        """``out[start:stop] = a[start:stop] + b`` in place."""
        self.scale_add_slice(out, a, 1.0, b, start, stop)  # 1 * a is exact

    def fill_zero(self, x):
        """Set every element of the buffer ``x`` to zero, in place."""
        self.zero_at(x, self.arange(0, int(x.shape[0]), x))

    def momentum_slice(self, out, velocity, momentum, result, start, stop):
        """Momentum SGD on an averaged gradient ``result``: ``out[start:stop] =
        momentum * velocity[start:stop] + result``, then ``result = out[start:stop]``
        in place; return whether every element of ``result`` is finite."""
        self.scale_add_slice(out, velocity, momentum, result, start, stop)
        self.copy_slice(result, out[start:stop], 0, stop - start)
        return self.all_finite(result)

    def all_finite(self, x):
        """Whether every element is finite: the float64 sum of float32 squares
        cannot overflow, so it is finite exactly when they all are."""
        return bool(np.isfinite(self.segment_sq_norms(x, [(0, int(x.shape[0]))])).all())

    def accumulate_slice(self, acc, residual, grad, start, stop, scale=None, velocity=None,
                         momentum=0.0, nesterov=False):
        """Error feedback for one gradient: ``acc[start:stop] = residual[start:stop] + g``
        with ``g = scale * grad`` (``grad`` unscaled when ``scale`` is ``None``);
        under momentum correction ``velocity = (new, old)`` and first
        ``new[start:stop] = momentum * old[start:stop] + g``, then ``g =
        new[start:stop]`` (Nesterov: ``g = momentum * new[start:stop] + g``).
        ``grad`` may be a view of ``acc[start:stop]`` (each element is read before
        it is written).  Returns whether the slice of ``acc`` is all finite, or ``None`` where the
        backend does not check in the same pass."""
        if scale is not None or nesterov:  # (Nesterov reads grad after writing acc: a copy)
            grad = self.multiply(grad, 1.0 if scale is None else scale)
        if velocity is not None:
            new, old = velocity
            self.scale_add_slice(new, old, momentum, grad, start, stop)
            if nesterov:
                self.scale_add_slice(acc, new, momentum, grad, start, stop)
                grad = acc[start:stop]
            else:
                grad = new[start:stop]
        self.add_slice(acc, residual, grad, start, stop)
        return None

    def accumulate_scan_slice(self, acc, residual, grad, start, stop, scale, scan):
        """:meth:`accumulate_slice` without momentum that also collects
        :meth:`abs_ge_entries` of the new ``acc`` for ``scan = (lo, hi, threshold,
        expected)`` (``[lo, hi)`` inside ``[start, stop)``): returns ``(finite,
        indices, values)``, ``finite`` as :meth:`accumulate_slice`'s.  A backend
        that can collects in the same pass."""
        finite = self.accumulate_slice(acc, residual, grad, start, stop, scale)
        lo, hi, threshold, expected = scan
        return (finite, *self.abs_ge_entries(acc, threshold, lo, hi, expected))

    def keep_rounding_error(self, x, indices, dtype):
        """``x[i] -= float32(dtype(x[i]))`` at ``indices``, in place: what rounding
        to the wire ``dtype`` (``"float16"``) loses stays behind."""
        values = self.take(x, indices)
        lost = values - self.astype(self.astype(values, dtype), "float32")
        self.zero_at(x, indices)
        self.scatter_add(x, indices, lost)

    def abs_ge_entries(self, x, threshold, start, stop, expected=0):
        """``(indices, x[indices])`` for the ``indices`` of :meth:`abs_ge_indices`;
        ``expected``, about how many there will be, is a hint a backend may use."""
        indices = self.abs_ge_indices(x, threshold, start, stop)
        return indices, self.take(x, indices)

    def select_abs_ge(self, indices, values, threshold):
        """``indices[|values| >= threshold]``."""
        return self.take(indices, self.abs_ge_indices(values, threshold, 0, int(values.shape[0])))

    def count_unique(self, indices):
        return int(self.unique(indices).shape[0])

    def count_abs_ge_each(self, x, thresholds):
        """Host int64 array: for each threshold ``t`` (ascending), how many ``|x[i]| >= t``."""
        n = int(x.shape[0])
        return np.array([self.abs_ge_indices(x, t, 0, n).shape[0] for t in thresholds], np.int64)

    def intersect(self, a, b):
        """Indices in both ascending, duplicate-free index vectors, ascending: those
        whose count in the merged union is 2."""
        ones_a, ones_b = (self.zeros(int(v.shape[0]), v) + 1 for v in (a, b))
        merged, counts = self.merge_sum(a, ones_a, b, ones_b)
        return self.select_abs_ge(merged, counts, 2.0)

    def max_abs(self, x):
        """``max |x|`` of a small vector as a Python float (0 for an empty vector)."""
        host = self.to_host(x)
        return float(np.abs(host).max()) if host.size else 0.0

    def host_view(self, x):
        """``x``'s own memory as a writable numpy array where the framework can share
        it (a CPU vector), else ``None``: compiled host kernels then run on it."""
        return None


class NumpyOps(ArrayOps):
    """Plain numpy implementation, used by mpi4py scripts and unit tests."""

    def zeros(self, n, like=None):
        return np.zeros(n, dtype=np.float32)

    def arange(self, start, stop, like=None):
        return np.arange(start, stop, dtype=np.int64)

    def from_host(self, array, like=None):
        return np.asarray(array)

    def to_host(self, x):
        return np.asarray(x)

    def astype(self, x, dtype):
        return np.asarray(x).astype(dtype, copy=False)

    def take(self, x, indices):
        return x[indices]

    def scatter_add(self, dense, indices, values):
        np.add.at(dense, indices, values)

    def zero_at(self, x, indices):
        x[indices] = 0

    def concat(self, vectors):
        return np.concatenate(vectors)

    def scale_add_slice(self, out, x, factor, y, start, stop):
        np.multiply(x[start:stop], x.dtype.type(factor), out=out[start:stop])
        np.add(out[start:stop], y, out=out[start:stop])

    def copy_slice(self, out, x, start, stop):
        np.copyto(out[start:stop], x)

    def multiply(self, x, factor):
        return x * (x.dtype.type(factor) if np.isscalar(factor) else factor)

    def divide(self, x, divisor):
        return x / x.dtype.type(divisor)

    def abs_ge_indices(self, x, threshold, start, stop):
        return kernels.abs_ge_indices(x, threshold, start, stop)

    def abs_ge_entries(self, x, threshold, start, stop, expected=0):
        return kernels.abs_ge_entries(x, threshold, start, stop, expected)

    def topk_abs_indices(self, x, k, start, stop):
        return topk_abs(x, k, start, stop)

    def unique(self, indices):
        return np.unique(indices)

    def merge_sum(self, indices_a, values_a, indices_b, values_b):
        merged, position = np.unique(np.concatenate([indices_a, indices_b]), return_inverse=True)
        values = np.zeros(merged.size, dtype=values_a.dtype)
        np.add.at(values, position, np.concatenate([values_a, values_b]))
        return merged.astype(np.int64), values

    def segment_sq_norms(self, x, bounds):
        return np.array([kernels.sq_norm(x[s:e]) for s, e in bounds], dtype=np.float64)

    def median_rows(self, rows):
        return np.sort(np.stack(rows), axis=0)[(len(rows) - 1) // 2]

    # faster than the defaults
    def add_slice(self, out, a, b, start, stop):
        np.add(a[start:stop], b, out=out[start:stop])

    def fill_zero(self, x):
        kernels.fill_zero(x)

    def all_finite(self, x):
        return kernels.all_finite(x)

    def momentum_slice(self, out, velocity, momentum, result, start, stop):
        return kernels.momentum_result(out[start:stop], velocity[start:stop], momentum, result)

    def accumulate_slice(self, acc, residual, grad, start, stop, scale=None, velocity=None,
                         momentum=0.0, nesterov=False):
        new, old = (None, None) if velocity is None else (velocity[0][start:stop],
                                                          velocity[1][start:stop])
        return kernels.accumulate(acc[start:stop], residual[start:stop], grad,
                                  1.0 if scale is None else scale, new, old, momentum, nesterov)

    def accumulate_scan_slice(self, acc, residual, grad, start, stop, scale, scan):
        lo, hi, threshold, expected = scan
        return kernels.accumulate_scan(acc, residual, grad, 1.0 if scale is None else scale,
                                       start, stop, lo, hi, threshold, expected)

    def count_abs_ge_each(self, x, thresholds):
        return kernels.count_abs_ge_each(x, thresholds)

    def host_view(self, x):
        return x
