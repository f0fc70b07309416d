"""Exclusive partitions of the flat gradient and their rotation among workers.

* :func:`even_bounds` (MiCRO): ``P`` contiguous partitions, the first
  ``n mod P`` one element longer.
* :class:`BlockPartition` (ExDyna): partitions are runs of fixed-size blocks
  whose boundaries move between steps to balance the selected counts.
* :func:`owned_partition`: worker ``r`` owns partition ``(t + r) mod P`` at
  step ``t``, so ownership is exclusive and rotates through all partitions.
"""

import math
from dataclasses import dataclass

import numpy as np


def owned_partition(step, rank, size):
    return (step + rank) % size


def owner_of(partition, step, size):
    """The rank that owned ``partition`` at ``step``."""
    return (partition - step) % size


def even_bounds(n, size):
    base, extra = divmod(n, size)
    bounds, start = [], 0
    for j in range(size):
        stop = start + base + (1 if j < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


REBALANCE_RULES = ("paper", "proportional", "none")


def paper_min_blocks(num_blocks, size):
    """ExDyna's floor on a partition's blocks: ``num_blocks / (4P)``."""
    return max(1, num_blocks // (4 * size))


@dataclass(frozen=True)
class BlockPartition:
    """ExDyna's layout: ``num_blocks`` blocks of ``block`` elements, ``P`` partitions.

    ``edges[j]:edges[j+1]`` are partition ``j``'s blocks; the last partition
    also takes the ``n - num_blocks * block`` remainder elements.  Block size:
    ``floor(n / 1024)`` rounded down to a multiple of 32 (ExDyna); 32 for
    models under 32 Ki elements and 1 for models under ``32 P``.  Ours: we
    use ``floor(n / block)`` blocks (1024 up to the rounding) so the
    remainder stays under one block -- with exactly 1024 blocks the rounding
    can leave up to ``31 * 1024`` elements to the last partition, beyond the
    reach of rebalancing (23 % of an 85 K-parameter model).
    Every partition keeps at least ``min_blocks`` blocks: ExDyna's
    ``num_blocks // (4P)`` by default (see :func:`paper_min_blocks`).
    """

    n: int
    block: int
    num_blocks: int
    edges: tuple
    min_blocks: int
    block_loads: tuple = None  # the proportional rule's per-block load estimate

    @classmethod
    def initial(cls, n, size, target_blocks=1024, alignment=32, min_blocks=None):
        block = (n // target_blocks) // alignment * alignment
        if block == 0:
            block = alignment if n >= alignment * size else 1
        num_blocks = n // block
        edges = tuple(start for start, _ in even_bounds(num_blocks, size)) + (num_blocks,)
        if min_blocks is None:
            min_blocks = paper_min_blocks(num_blocks, size)
        least = 0 if num_blocks < size else min(max(1, min_blocks), num_blocks // size)
        return cls(n=n, block=block, num_blocks=num_blocks, edges=edges, min_blocks=least)

    @property
    def size(self):
        return len(self.edges) - 1

    def bounds(self):
        starts = [edge * self.block for edge in self.edges[:-1]]
        stops = starts[1:] + [self.n]
        return tuple(zip(starts, stops))

    def blocks(self):
        return np.diff(np.array(self.edges))

    def rebalanced(self, loads, rule):
        """The partition after one rebalancing step given each partition's last load.

        ``loads[j]`` is the count selected last step in partition ``j`` (as
        laid out by ``self``).  ``"paper"``: ExDyna's sweep, one block per
        adjacent pair; ``"proportional"``: boundaries placed at equal shares
        of an estimated per-block load; ``"none"``: unchanged.
        """
        if rule == "none" or self.size == 1:
            return self
        loads = np.asarray(loads, dtype=np.float64)
        total = loads.sum()
        if total <= 0:
            return self
        block_loads = None
        if rule == "paper":
            edges = self._paper_sweep(loads, total)
        elif rule == "proportional":
            edges, block_loads = self._proportional(loads, total)
        else:
            raise ValueError(f"rebalance must be one of {REBALANCE_RULES}, got {rule!r}")
        return BlockPartition(n=self.n, block=self.block, num_blocks=self.num_blocks,
                              edges=tuple(int(e) for e in edges), min_blocks=self.min_blocks,
                              block_loads=block_loads)

    def _paper_sweep(self, loads, total):
        """ExDyna: sweep adjacent pairs left to right, move one block toward the
        side under ``mean / 1.05`` when the other is over ``1.05 mean``; both
        estimates move by ``block * K / n`` so moves cascade."""
        edges, loads, blocks = list(self.edges), loads.copy(), self.blocks().copy()
        mean, shift = total / self.size, self.block * total / self.n
        high, low = 1.05 * mean, mean / 1.05
        for j in range(self.size - 1):
            if loads[j] > high and loads[j + 1] < low and blocks[j] > self.min_blocks:
                edges[j + 1] -= 1
                blocks[j] -= 1
                blocks[j + 1] += 1
                loads[j] -= shift
                loads[j + 1] += shift
            elif loads[j + 1] > high and loads[j] < low and blocks[j + 1] > self.min_blocks:
                edges[j + 1] += 1
                blocks[j] += 1
                blocks[j + 1] -= 1
                loads[j] += shift
                loads[j + 1] -= shift
        return edges

    def _proportional(self, loads, total):
        """Our rule: keep a per-block load estimate, rescale it so each partition's
        blocks add up to the load it just reported (within a partition the
        previous estimate gives the shape, plus a floor of 1e-3 of the mean so
        quiet regions can recover), then cut the cumulative estimate into ``P``
        equal shares at block boundaries (respecting ``min_blocks``)."""
        prior = (np.ones(self.num_blocks) if self.block_loads is None
                 else np.array(self.block_loads, dtype=np.float64))
        weights = prior + 1e-3 * (math.fsum(prior) / self.num_blocks)
        estimate = np.zeros(self.num_blocks, dtype=np.float64)
        for j, (first, last) in enumerate(zip(self.edges[:-1], self.edges[1:])):
            if last > first:
                estimate[first:last] = weights[first:last] * (loads[j] / math.fsum(weights[first:last]))
        cumulative = np.concatenate([[0.0], np.cumsum(estimate)])
        edges = [0]
        for j in range(1, self.size):
            target = cumulative[-1] * j / self.size
            edge = min(int(np.searchsorted(cumulative, target, side="left")), self.num_blocks)
            if edge > 0 and target - cumulative[edge - 1] < cumulative[edge] - target:
                edge -= 1
            lowest = edges[-1] + self.min_blocks
            highest = self.num_blocks - (self.size - j) * self.min_blocks
            edges.append(min(max(edge, lowest), highest))
        edges.append(self.num_blocks)
        return edges, tuple(estimate.tolist())
