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
    """ExDyna's floor on a partition's blocks: ``num_blocks / (4P)``, a real number
    as in the released code (at least 1)."""
    return max(1, num_blocks / (4 * size))


@dataclass(frozen=True)
class BlockPartition:
    """ExDyna's layout: ``num_blocks`` blocks of ``block`` elements, ``P`` partitions.

    ``edges[j]:edges[j+1]`` are partition ``j``'s blocks; the last partition
    also takes the ``n - num_blocks * block`` remainder elements.  Block size:
    ``floor(n / 1024)`` rounded down to a multiple of 32 (ExDyna); 32 for
    models under 32 Ki elements and 1 for models under ``32 P``.  ExDyna
    (``exact_blocks``, the paper rule) has exactly ``target_blocks`` (1024)
    blocks wherever the model has 32 Ki elements or more, so the rounding can
    leave up to ``31 * 1024`` elements to the last partition,
    beyond the reach of rebalancing (23 % of an 85 K-parameter model); ours
    uses ``floor(n / block)`` blocks so the remainder stays under one block.
    Every partition keeps at least ``min_blocks`` blocks: ExDyna's
    ``num_blocks / (4P)`` by default (see :func:`paper_min_blocks`).
    """

    n: int
    block: int
    num_blocks: int
    edges: tuple
    min_blocks: float
    block_loads: tuple = None  # the proportional rule's per-block load estimate

    @classmethod
    def from_state(cls, saved):
        """The partition ``dataclasses.asdict`` saved (a checkpoint's lists as tuples)."""
        return cls(**{key: tuple(value) if isinstance(value, list) else value
                      for key, value in saved.items()})

    @classmethod
    def initial(cls, n, size, target_blocks=1024, alignment=32, min_blocks=None,
                exact_blocks=False):
        block = (n // target_blocks) // alignment * alignment
        if block:
            num_blocks = target_blocks if exact_blocks else n // block
        else:  # a small model: blocks of 32 (or 1), every element in one
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
        """ExDyna's released sweep: over adjacent pairs left to right, with the mean
        load ``m = int(K / P)``, move one block toward the side under ``0.95238 m``
        when the other is over ``1.05 m`` (each ratio ``load / m``) and the
        giving side keeps ``min_blocks``; both loads move by
        ``int(block * K / n)`` so moves cascade.  No move while ``m`` is 0."""
        edges, loads, blocks = list(self.edges), loads.copy(), self.blocks().copy()
        mean, shift = int(total / self.size), int(self.block * (total / self.n))
        if mean == 0:
            return edges
        for j in range(self.size - 1):
            left, right = loads[j] / mean, loads[j + 1] / mean
            if left > 1.05 and right < 0.95238 and blocks[j] - 1 >= self.min_blocks:
                move = -1  # the boundary moves left: a block to partition j + 1
            elif left < 0.95238 and right > 1.05 and blocks[j + 1] - 1 >= self.min_blocks:
                move = 1
            else:
                continue
            edges[j + 1] += move
            blocks[j] += move
            blocks[j + 1] -= move
            loads[j] += move * shift
            loads[j + 1] -= move * shift
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
        edges, least = [0], math.ceil(self.min_blocks)  # whole blocks
        for j in range(1, self.size):
            target = cumulative[-1] * j / self.size
            edge = min(int(np.searchsorted(cumulative, target, side="left")), self.num_blocks)
            if edge > 0 and target - cumulative[edge - 1] < cumulative[edge] - target:
                edge -= 1
            lowest = edges[-1] + least
            highest = self.num_blocks - (self.size - j) * least
            edges.append(min(max(edge, lowest), highest))
        edges.append(self.num_blocks)
        return edges, tuple(estimate.tolist())
