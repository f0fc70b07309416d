"""``ArrayOps`` over torch tensors: every per-element step runs on the tensor's device."""

import numpy as np
import torch

from ..core.ops import ArrayOps


class TorchOps(ArrayOps):
    def zeros(self, n, like):
        return torch.zeros(n, dtype=torch.float32, device=like.device)

    def add(self, a, b, out):
        return torch.add(a, b, out=out)

    def all_finite(self, x):
        return bool(torch.isfinite(x).all())

    def abs_ge_indices(self, x, threshold, start, stop):
        return torch.nonzero(x[start:stop].abs() >= float(threshold)).squeeze(1) + start

    def topk_abs_indices(self, x, k, start, stop):
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

    def scatter_add(self, dense, indices, values):
        dense.index_add_(0, indices, values)

    def concat(self, vectors):
        return torch.cat(vectors)

    def divide(self, x, divisor):
        return x / divisor

    def count_abs_ge_each(self, x, thresholds):
        rungs = torch.as_tensor(thresholds, dtype=x.dtype, device=x.device)
        if x.numel() == 0:
            return np.zeros(len(thresholds), dtype=np.int64)
        magnitude = torch.sort(x.abs()).values
        below = torch.searchsorted(magnitude, rungs, right=False)
        return (x.numel() - below).cpu().numpy().astype(np.int64)

    def select_abs_ge(self, indices, values, threshold):
        return indices[values.abs() >= float(threshold)]

    def count_unique(self, indices):
        return int(torch.unique(indices).numel())

    def narrow_index(self, indices):
        return indices.to(torch.int32)

    def widen_index(self, indices):
        return indices.to(torch.int64)

    def arange(self, start, stop, like):
        return torch.arange(start, stop, device=like.device)

    def to_host(self, x):
        return x.detach().cpu().numpy()

    def from_host(self, array, like=None):
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if like is None else tensor.to(like.device)

    def segment_sq_norms(self, x, bounds):
        if not bounds:
            return np.zeros(0, dtype=np.float64)
        norms = torch.stack([x[s:e].to(torch.float64).square().sum() for s, e in bounds])
        return norms.cpu().numpy()
