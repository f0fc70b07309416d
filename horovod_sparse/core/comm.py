"""Collectives the sparsifiers use, behind one small interface, with traffic metering.

A :class:`Communicator` offers four collectives over framework vectors

* ``allgather(x, counts)``: concatenation of every rank's ``x`` in rank order;
  ``counts[r]`` (known to all ranks) is rank ``r``'s length;
* ``allreduce_sum(x)``: elementwise sum over ranks, identical bits everywhere;
* ``broadcast(x, root)``: ``root``'s ``x`` on every rank;
* ``alltoall(x, splits)``: rank ``r`` sends ``splits[j]`` consecutive
  elements of ``x`` to rank ``j`` and returns what it received, in rank
  order, with the received splits;

and ``allgather_host(a)`` / ``broadcast_host(a, root)`` / ``allreduce_host(a)``
for numpy arrays on the host (control data, checkpoint state;
``allgather_host`` returns shape ``(P,) + a.shape``).
Implementations: :class:`SimulatedCommunicator`
(threads in one process, for unit tests), ``horovod_sparse.torch.comm``
(Horovod), ``horovod_sparse.mpi`` (mpi4py).

Every call is metered in logical payload: an allgather sends the rank's own
elements and receives everybody else's; an allreduce sends and receives the
vector once; a broadcast sends from the root and receives elsewhere.  (The
wire traffic of a ring allreduce is ``2(P-1)/P`` times that.)  Every call is
also timed and counted: ``traffic.seconds`` is the wall-clock time spent in
collectives, ``traffic.rounds`` how many ran.
"""

import copy
import threading
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Traffic:
    """Elements and bytes this rank sent and received, per collective kind."""

    elements_sent: dict = field(default_factory=dict)
    elements_received: dict = field(default_factory=dict)
    bytes_sent: dict = field(default_factory=dict)
    bytes_received: dict = field(default_factory=dict)
    seconds: float = 0.0
    rounds: int = 0  # collectives run (each one waits for every rank)

    def record(self, kind, sent, received, itemsize):
        for table, value in ((self.elements_sent, sent), (self.elements_received, received),
                             (self.bytes_sent, sent * itemsize),
                             (self.bytes_received, received * itemsize)):
            table[kind] = table.get(kind, 0) + int(value)

    def totals(self):
        totals = {name: sum(getattr(self, name).values())
                  for name in ("elements_sent", "elements_received", "bytes_sent", "bytes_received")}
        totals["seconds"], totals["rounds"] = self.seconds, self.rounds
        return totals


class Communicator:
    """Interface plus metering; subclasses implement the underscored methods."""

    rank = 0
    size = 1

    def __init__(self):
        self.traffic = Traffic()

    def current_world(self):
        """``(rank, size)`` as the framework has them now (they differ from
        ``rank``/``size`` after an elastic restart)."""
        return self.rank, self.size

    def reset_traffic(self):
        """Return the traffic since the last reset and start a new count."""
        traffic, self.traffic = self.traffic, Traffic()
        return traffic

    def allgather(self, x, counts):
        counts = [int(c) for c in counts]
        if len(counts) != self.size or counts[self.rank] != self._numel(x):
            raise ValueError(f"allgather counts {counts} do not match rank {self.rank}'s "
                             f"{self._numel(x)} elements")
        self.traffic.record("allgather", counts[self.rank], sum(counts) - counts[self.rank],
                            self._itemsize(x))
        return self._timed(self._allgather, x, counts)

    def allreduce_sum(self, x):
        n = self._numel(x)
        self.traffic.record("allreduce", n, n, self._itemsize(x))
        return self._timed(self._allreduce_sum, x)

    def broadcast(self, x, root):
        n = self._numel(x)
        is_root = self.rank == root
        self.traffic.record("broadcast", n if is_root else 0, 0 if is_root else n,
                            self._itemsize(x))
        return self._timed(self._broadcast, x, root)

    def alltoall(self, x, splits):
        splits = [int(s) for s in splits]
        if len(splits) != self.size or sum(splits) != self._numel(x):
            raise ValueError(f"alltoall splits {splits} do not cover rank {self.rank}'s "
                             f"{self._numel(x)} elements")
        received, received_splits = self._timed(self._alltoall, x, splits)
        received_splits = [int(s) for s in received_splits]
        own = splits[self.rank]
        self.traffic.record("alltoall", sum(splits) - own, sum(received_splits) - own,
                            self._itemsize(x))
        return received, received_splits

    def allgather_host(self, array, timeout=None):
        """``timeout`` (seconds): raise ``TimeoutError`` if the other ranks have not
        joined by then (where the implementation can wait with a deadline)."""
        array = np.ascontiguousarray(array)
        self.traffic.record("allgather", array.size, array.size * (self.size - 1),
                            array.itemsize)
        if timeout is None:
            return self._timed(self._allgather_host, array)
        return self._timed(self._allgather_host_within, array, timeout)

    def broadcast_host(self, array, root):
        array = np.ascontiguousarray(array)
        is_root = self.rank == root
        self.traffic.record("broadcast", array.size if is_root else 0,
                            0 if is_root else array.size, array.itemsize)
        return self._timed(self._broadcast_host, array, root)

    def allreduce_host(self, array):
        """Elementwise sum of every rank's float64 ``array``, the same bits on every rank."""
        array = np.ascontiguousarray(array, dtype=np.float64)
        self.traffic.record("allreduce", array.size, array.size, array.itemsize)
        return self._timed(self._allreduce_host, array)

    def _timed(self, collective, *args):
        self.traffic.rounds += 1
        start = time.perf_counter()
        try:
            return collective(*args)
        finally:
            self.traffic.seconds += time.perf_counter() - start

    # -- implementation hooks -------------------------------------------------
    def _numel(self, x):
        return int(np.size(x))

    def _itemsize(self, x):
        return np.asarray(x).itemsize

    def _allgather(self, x, counts):
        raise NotImplementedError

    def _allreduce_sum(self, x):
        raise NotImplementedError

    def _broadcast(self, x, root):
        raise NotImplementedError

    def _alltoall(self, x, splits):
        raise NotImplementedError

    def _allgather_host(self, array):
        raise NotImplementedError

    def _allgather_host_within(self, array, timeout):
        """:meth:`_allgather_host` with a deadline; by default none is kept."""
        return self._allgather_host(array)

    def _broadcast_host(self, array, root):
        raise NotImplementedError

    def _allreduce_host(self, array):
        raise NotImplementedError


class ProcessSetCommunicator(Communicator):
    """Base of the Horovod communicators: the ranks of a Horovod process set, and
    operation names ``horovod_sparse.<n>`` with ``n`` counting the calls since the
    last :meth:`reset_traffic` (one step), so each position in a step reuses its
    name (Horovod's response cache) and all ranks agree on it."""

    def __init__(self, process_set):
        super().__init__()
        self.process_set = process_set
        self.rank, self.size = process_set.rank(), process_set.size()
        self._calls = 0

    def reset_traffic(self):
        self._calls = 0
        return super().reset_traffic()

    def current_world(self):
        return self.process_set.rank(), self.process_set.size()

    def global_rank(self, rank):
        """Horovod's broadcast takes the root as a global rank; ours are set ranks."""
        return self.process_set.ranks[rank]

    def _name(self):
        self._calls += 1
        return f"horovod_sparse.{self._calls}"


class _SimulatedGroup:
    """Shared mailbox and barrier of ``size`` simulated ranks (threads)."""

    def __init__(self, size, timeout):
        self.size = size
        self.slots = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)

    def all_items(self, rank, item):
        """Every rank's ``item``, copied before any rank may return and reuse its
        buffer (as a real collective has read its input by the time it returns)."""
        self.slots[rank] = item
        self.barrier.wait()
        items = copy.deepcopy(self.slots)
        self.barrier.wait()
        self.slots[rank] = None  # every rank has its copy: hold nothing between rounds
        return items


class SimulatedCommunicator(Communicator):
    """One of ``P`` ranks simulated as threads in one process (numpy vectors).

    Reductions add the ranks' contributions in rank order.
    """

    def __init__(self, rank, group):
        super().__init__()
        self.rank, self.size, self._group = rank, group.size, group

    def _allgather(self, x, counts):
        return np.concatenate([np.asarray(v) for v in self._group.all_items(self.rank, x)])

    def _allreduce_sum(self, x):
        parts = self._group.all_items(self.rank, x)
        total = np.array(parts[0], copy=True)
        for part in parts[1:]:
            total += part
        return total

    def _broadcast(self, x, root):
        return np.array(self._group.all_items(self.rank, x)[root], copy=True)

    def _alltoall(self, x, splits):
        parts = []
        for sent, their_splits in self._group.all_items(self.rank, (np.asarray(x), splits)):
            start = sum(their_splits[:self.rank])
            parts.append(sent[start:start + their_splits[self.rank]])
        return np.concatenate(parts), [len(part) for part in parts]

    def _allgather_host(self, array):
        return np.stack(self._group.all_items(self.rank, array))

    def _broadcast_host(self, array, root):
        return np.array(self._group.all_items(self.rank, array)[root], copy=True)

    def _allreduce_host(self, array):
        return self._allreduce_sum(array)


def run_simulated(size, worker, timeout=60.0):
    """Run ``worker(comm)`` on ``size`` simulated ranks; return their results in rank order.

    An exception on any rank aborts the group (no rank hangs) and is re-raised.
    """
    group = _SimulatedGroup(size, timeout)
    results, errors = [None] * size, [None] * size

    def run(rank):
        try:
            results[rank] = worker(SimulatedCommunicator(rank, group))
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors[rank] = error
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results
