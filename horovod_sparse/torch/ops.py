"""``ArrayOps`` over torch tensors: every per-element step runs on the tensor's device."""

import math

import numpy as np
import torch

from ..core.ops import ArrayOps, NumpyOps


_NUMPY = NumpyOps()


def _host_view(x):
    """``x``'s own memory as a numpy array where numpy can share it (a CPU tensor
    of a dtype numpy has: not bfloat16), else ``None``."""
    if x.is_cpu and x.dtype != torch.bfloat16:  # the cheapest tests: ~1 us a call in all
        return (x.detach() if x.requires_grad else x).numpy()
    return None


class TorchOps(ArrayOps):
    """Selection scans the partition in chunks through small reusable buffers, so
    the magnitudes and the mask stay in cache and no gradient-sized temporary is
    allocated per step.  On CPU the accumulation, the threshold scan, the
    top-k and the ladder counts run in the compiled kernels of
    :mod:`horovod_sparse.core.kernels` over the tensor's own memory
    (:func:`_host_view`, no copy): torch's CPU ``ge`` + ``nonzero`` cost about
    4x numpy's on the same chunk, its ``topk`` about 20x the sampled top-k,
    its ``bucketize`` or ``sort`` of the candidates 10-20x numpy's ``sort``."""

    chunk = 1 << 18  # elements per step of the scan on accelerators

    def __init__(self):
        self._scratch = {}

    def _buffers(self, like):
        key = (like.device, like.dtype)
        if key not in self._scratch:
            self._scratch[key] = (torch.empty(self.chunk, dtype=like.dtype, device=like.device),
                                  torch.empty(self.chunk, dtype=torch.bool, device=like.device))
        return self._scratch[key]

    def zeros(self, n, like):
        return torch.zeros(n, dtype=torch.float32, device=like.device)

    def add_slice(self, out, a, b, start, stop):
        torch.add(a[start:stop], b, out=out[start:stop])

    def momentum_slice(self, out, velocity, momentum, result, start, stop):
        # one pass over the tensors' memory (compiled for float32), the finiteness check
        # included: a plain dense step's ~6 small gradients cost 5-10 us a torch call
        hosts = [_host_view(x) for x in (out, velocity, result)]
        if any(host is None for host in hosts):
            return super().momentum_slice(out, velocity, momentum, result, start, stop)
        return _NUMPY.momentum_slice(*hosts[:2], momentum, hosts[2], start, stop)

    def fill_zero(self, x):
        host = _host_view(x)
        if host is None:
            x.zero_()
        else:
            _NUMPY.fill_zero(host)

    def accumulate_slice(self, acc, residual, grad, start, stop, scale=None, velocity=None,
                         momentum=0.0, nesterov=False):
        views = [_host_view(t) for t in (acc, residual, grad, *(velocity or ()))]
        if grad.dtype != torch.float32 or any(view is None for view in views):
            return super().accumulate_slice(acc, residual, grad, start, stop, scale, velocity,
                                            momentum, nesterov)
        return _NUMPY.accumulate_slice(views[0], views[1], views[2], start, stop, scale,
                                       views[3:] or None, momentum, nesterov)

    def accumulate_scan_slice(self, acc, residual, grad, start, stop, scale, scan):
        views = [_host_view(t) for t in (acc, residual, grad)]
        if grad.dtype != torch.float32 or any(view is None for view in views):
            return super().accumulate_scan_slice(acc, residual, grad, start, stop, scale, scan)
        finite, indices, values = _NUMPY.accumulate_scan_slice(*views, start, stop, scale, scan)
        return finite, torch.from_numpy(indices), torch.from_numpy(values)

    def all_finite(self, x):
        # A finite sum means every element is finite; only an overflowing sum needs the full check.
        return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())

    def abs_ge_indices(self, x, threshold, start, stop):
        host = _host_view(x)
        if host is not None:
            return torch.from_numpy(_NUMPY.abs_ge_indices(host, threshold, start, stop))
        magnitude, mask = self._buffers(x)
        found = []
        for first in range(start, stop, self.chunk):
            last = min(first + self.chunk, stop)
            torch.abs(x[first:last], out=magnitude[:last - first])
            torch.ge(magnitude[:last - first], float(threshold), out=mask[:last - first])
            found.append(torch.nonzero(mask[:last - first]).squeeze(1) + first)
        return torch.cat(found) if found else torch.empty(0, dtype=torch.int64, device=x.device)

    def abs_ge_entries(self, x, threshold, start, stop, expected=0):
        host = _host_view(x)
        if host is None:
            return super().abs_ge_entries(x, threshold, start, stop)
        return tuple(map(torch.from_numpy,
                         _NUMPY.abs_ge_entries(host, threshold, start, stop, expected)))

    def topk_abs_indices(self, x, k, start, stop):
        host = _host_view(x)
        if host is not None:  # sampled threshold + one scan: ~20x torch.topk on CPU
            return torch.from_numpy(_NUMPY.topk_abs_indices(host, k, start, stop))
        magnitude = x[start:stop].abs()
        if k >= magnitude.numel():
            return torch.arange(start, stop, device=x.device)
        if k <= 0:
            return torch.empty(0, dtype=torch.int64, device=x.device)
        top = torch.topk(magnitude, k, sorted=False)
        kth = top.values.min()
        above_or_equal = magnitude >= kth
        if int(above_or_equal.sum()) == k:
            indices = top.indices
        else:  # ties at the k-th magnitude: keep the lowest indices among them
            above = torch.nonzero(magnitude > kth).squeeze(1)
            tied = torch.nonzero(magnitude == kth).squeeze(1)[:k - above.numel()]
            indices = torch.cat([above, tied])
        return torch.sort(indices).values + start

    def take(self, x, indices):
        return x.index_select(0, indices)

    def zero_at(self, x, indices):
        x.index_fill_(0, indices, 0)

    def astype(self, x, dtype):
        return x.to(getattr(torch, dtype))

    def scatter_add(self, dense, indices, values):
        dense.index_add_(0, indices, values)

    def concat(self, vectors):
        return torch.cat(vectors)

    def divide(self, x, divisor):
        return x / divisor

    def count_abs_ge_each(self, x, thresholds):
        host = _host_view(x)
        if host is not None:
            return _NUMPY.count_abs_ge_each(host, thresholds)
        return super().count_abs_ge_each(x, thresholds)

    def arange(self, start, stop, like):
        return torch.arange(start, stop, device=like.device)

    def to_host(self, x):
        return x.detach().cpu().numpy()

    def host_view(self, x):
        return _host_view(x)

    def from_host(self, array, like=None):
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if like is None else tensor.to(like.device)

    def segment_sq_norms(self, x, bounds):
        if not bounds:
            return np.zeros(0, dtype=np.float64)
        view = _host_view(x)
        if view is not None:
            return _NUMPY.segment_sq_norms(view, bounds)
        def sq_norm(s, e):  # a chunk at a time: no float64 copy of a segment
            chunks = (x[first:min(first + self.chunk, e)].to(torch.float64)
                      for first in range(s, e, self.chunk))
            return sum((chunk.square().sum() for chunk in chunks),
                       x.new_zeros((), dtype=torch.float64))
        return torch.stack([sq_norm(s, e) for s, e in bounds]).cpu().numpy()

    def scale_add_slice(self, out, x, factor, y, start, stop):
        torch.mul(x[start:stop], factor, out=out[start:stop])
        out[start:stop].add_(y)

    def copy_slice(self, out, x, start, stop):
        out[start:stop].copy_(x)

    def multiply(self, x, factor):
        return x * factor

    def unique(self, indices):
        return torch.unique(indices, sorted=True)

    def merge_sum(self, indices_a, values_a, indices_b, values_b):
        merged, position = torch.unique(torch.cat([indices_a, indices_b]), sorted=True,
                                        return_inverse=True)
        values = torch.zeros(merged.numel(), dtype=values_a.dtype, device=values_a.device)
        values.index_add_(0, position, torch.cat([values_a, values_b]))
        return merged, values

    def median_rows(self, rows):
        # An odd-even transposition sorting network of elementwise min/max: the same
        # values as sorting, ~30x faster on CPU than torch.median over a stacked dim.
        rows = list(rows)
        for round_ in range(len(rows)):
            for i in range(round_ % 2, len(rows) - 1, 2):
                low, high = rows[i], rows[i + 1]
                rows[i], rows[i + 1] = torch.minimum(low, high), torch.maximum(low, high)
        return rows[(len(rows) - 1) // 2]
