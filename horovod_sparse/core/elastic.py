"""A compressor's state across Horovod elastic restarts.

Horovod elastic training (``hvd.elastic.run``) restarts its collectives when
workers are added, removed or fail, and brings every worker back to the state
of the last ``state.commit()``.  A compressor's state is *per rank*: rank
``r``'s residual ``e_r`` is what it has not sent yet, and the update still
pending is ``(1/P) sum_r e_r``.  So it is neither broadcast from rank 0 (every
rank would then send rank 0's residual again) nor simply kept (a removed
host's residual would be lost).  Instead:

* at each commit every rank keeps a :class:`Snapshot`: its own state and the
  mean of every rank's residuals and velocities (``core.checkpoint.average``:
  one allreduce, the same bits everywhere);
* after a restart where every worker is back at the rank and rank count it
  committed with, each resumes from its own state: bit-identical, as if
  nothing had happened (:func:`resume`);
* otherwise -- a host removed, added or replaced -- every rank starts from the
  committed mean ``e' = (1/P) sum_r e_r`` (rank 0's, broadcast: a new worker
  has none), which keeps the pending update, ``(1/P') sum_{r'} e' = e'``.  As
  in a checkpoint carried to another rank count, thresholds and partitions
  (they depend on ``P``) are rebuilt at the next step; the step count is kept.

When only hosts were removed, Horovod restarts without a sync: the compressor
notices the new world at its next step and takes the mean itself
(:func:`after_shrink`).
"""

import copy
from dataclasses import dataclass

import numpy as np

from . import checkpoint


@dataclass(frozen=True)
class Snapshot:
    """What a rank keeps at a commit: ``own`` state (stamped with its rank and
    size) and ``mean``, the carried-over state for any other world (``None``
    until the first collective commit or sync)."""

    own: dict
    mean: dict = None


def local_snapshot(own):
    """A snapshot taken without collectives (when the elastic state is built:
    a worker joining later must not start a collective the others are not in)."""
    return Snapshot(copy.deepcopy(own))


def commit(own, comm):
    """The snapshot of a commit (collective)."""
    own = copy.deepcopy(own)
    return Snapshot(own, checkpoint.average(own, comm))


def resume(snapshot, comm):
    """The state each rank of the new world loads after a restart, and the
    snapshot it keeps (collective over the new world; see the module text)."""
    resumable = snapshot.own.get("rank") == comm.rank and snapshot.own.get("size") == comm.size
    table = comm.allgather_host(np.array([resumable, snapshot.own.get("step", 0),
                                          snapshot.mean is not None], dtype=np.int64))
    if table[:, 0].all() and (table[:, 1] == table[0, 1]).all():
        if not table[:, 2].all():  # the first sync, before any commit
            return snapshot.own, commit(snapshot.own, comm)
        return snapshot.own, snapshot
    if not table[0, 2]:
        raise RuntimeError("elastic restart: rank 0 holds no committed compressor state to "
                           "carry over to the new workers")
    mean = checkpoint.broadcast(snapshot.mean, comm, root=0)
    return mean, Snapshot(mean, mean)


def after_shrink(snapshot, rank, size):
    """After a restart without sync (hosts only removed): the committed mean, which
    every surviving rank holds alike."""
    if snapshot is None or snapshot.mean is None:
        raise RuntimeError(
            f"Horovod now runs rank {rank} of {size}, another world than the compressor's last "
            "step, and the compressor's per-rank state has no committed carry-over: register "
            "it in the elastic state, hvd.elastic.TorchState(model, optimizer, "
            "compressor=compressor), and commit")
    return snapshot.mean
