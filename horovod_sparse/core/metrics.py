"""Per-step metrics every sparsifier reports (definitions in docs/methods.md)."""

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class StepMetrics:
    """What one exchange did on this rank.

    * ``density = nnz / n`` where ``nnz`` counts the aggregate's coordinates
      and ``n`` the sparsified part of the model; ``dense`` more elements were
      sent densely (``dense_below``), and ``overall_density`` counts them too;
    * ``density_error = |nnz / k - 1|`` and ``buildup = nnz / k``;
    * ``imbalance = P * max_i k_i / sum_i k_i - 1`` over the per-worker
      selection counts ``k_i``;
    * traffic is this rank's logical payload (see ``core.comm``);
    * times are wall-clock seconds of local selection, of collectives, and of
      the whole exchange on this rank (``total_time``: forming ``acc``,
      selection, collectives, the residual's commit).
    """

    step: int
    n: int
    k: int
    counts: list
    nnz: int
    threshold: float = float("nan")
    elements_sent: int = 0
    elements_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    selection_time: float = 0.0
    communication_time: float = 0.0
    total_time: float = 0.0
    rounds: int = 0
    dense: int = 0
    skipped: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def density(self):
        return self.nnz / self.n if self.n else 0.0

    @property
    def overall_density(self):
        total = self.n + self.dense
        return (self.nnz + self.dense) / total if total else 0.0

    @property
    def density_error(self):
        return abs(self.nnz / self.k - 1.0) if self.k else 0.0

    @property
    def buildup(self):
        return self.nnz / self.k if self.k else 0.0

    @property
    def imbalance(self):
        total = sum(self.counts)
        return len(self.counts) * max(self.counts) / total - 1.0 if total else 0.0

    def as_dict(self):
        row = asdict(self)
        row.update(density=self.density, overall_density=self.overall_density,
                   density_error=self.density_error,
                   buildup=self.buildup, imbalance=self.imbalance)
        return row


def summarize(history, skip_first=0):
    """Mean and max of the headline metrics over ``history[skip_first:]``."""
    rows = [m for m in list(history)[skip_first:] if not m.skipped]
    if not rows:
        return {}
    summary = {}
    for name in ("density", "overall_density", "density_error", "buildup", "imbalance", "bytes_sent",
                 "bytes_received", "selection_time", "communication_time", "total_time"):
        values = np.array([getattr(m, name) for m in rows], dtype=np.float64)
        summary[f"{name}_mean"] = float(values.mean())
        summary[f"{name}_max"] = float(values.max())
    summary["steps"] = len(rows)
    return summary
