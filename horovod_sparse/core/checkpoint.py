"""Compressor state in checkpoints: as bytes, gathered from every rank, and
carried over to a different number of ranks.

A compressor's state (``GradientExchange.state_dict``) is per rank: each
rank's residual ``e_r`` (and velocity ``u_r`` with momentum) holds what it has
not sent yet.  For a checkpoint that rank 0 alone writes, :func:`gather`
collects every rank's state into ``{"ranks": [state_0, ..., state_{P-1}]}``;
:func:`localize` turns that back into one rank's state:

* on the same number of ranks ``P``, rank ``r`` gets exactly ``state_r``
  (resuming is bit-identical);
* on ``P' != P`` ranks every rank starts from the mean of the old residuals
  (and velocities), ``e' = (1/P) sum_r e_r``.  The pending update -- what
  error feedback will still add to the averaged gradient, ``(1/P) sum_r e_r``
  -- is then unchanged: ``(1/P') sum_{r'} e' = e'``.  The sparsifier's own
  state (thresholds, partitions: they depend on ``P``) is not carried over;
  it is rebuilt at the first step as in a new run.  The step count is kept.

:func:`average` computes that carried-over state directly, with one allreduce
instead of gathering every rank's state (elastic training keeps it at each
commit); :func:`broadcast` sends one rank's state to all.
:func:`encode`/:func:`decode` turn a state into bytes and back exactly
(arrays in an ``.npz`` archive, everything else as JSON: floats round-trip).
"""

import io
import json
import zlib

import numpy as np

_ARRAY_GROUPS = ("residuals", "velocities", "dense_velocities")


def encode(state):
    """``bytes`` of a state dict (a rank's own or a gathered one)."""
    if "ranks" in state:
        parts = {f"rank{r}": np.frombuffer(encode(s), dtype=np.uint8)
                 for r, s in enumerate(state["ranks"])}
        return _npz(meta=json.dumps({"ranks": len(state["ranks"])}), **parts)
    arrays = {f"{group}/{name}": np.asarray(value, dtype=np.float32)
              for group in _ARRAY_GROUPS for name, value in state.get(group, {}).items()}
    rest = {key: value for key, value in state.items() if key not in _ARRAY_GROUPS}
    meta = {"groups": [group for group in _ARRAY_GROUPS if group in state], "state": rest}
    return _npz(meta=json.dumps(meta), **arrays)


def decode(data):
    """The state dict :func:`encode` was given."""
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as archive:
        meta = json.loads(str(archive["meta"]))
        if "ranks" in meta:
            return {"ranks": [decode(archive[f"rank{r}"].tobytes()) for r in range(meta["ranks"])]}
        state = dict(meta["state"])
        for group in meta["groups"]:
            prefix = f"{group}/"
            state[group] = {key[len(prefix):]: archive[key] for key in archive.files
                            if key.startswith(prefix)}
        return state


def gather(state, comm, timeout=None):
    """Every rank's ``state`` as ``{"ranks": [...]}`` (collective: call on all ranks;
    ``TimeoutError`` when the others do not join within ``timeout`` seconds, where
    the communicator can wait with a deadline)."""
    own = np.frombuffer(encode(state), dtype=np.uint8)
    try:
        lengths = comm.allgather_host(np.array([own.size], dtype=np.int64), timeout=timeout)[:, 0]
    except TimeoutError as error:
        raise TimeoutError(f"{error}: state_dict(all_ranks=True) is collective, every rank must "
                           "call it (rank 0 alone then saves the result)") from None
    padded = np.zeros(int(lengths.max()), dtype=np.uint8)
    padded[:own.size] = own
    rows = comm.allgather_host(padded)
    return {"ranks": [decode(row[:length].tobytes()) for row, length in zip(rows, lengths)]}


def average(state, comm):
    """What :func:`localize` gives a new rank count -- the step and the mean over
    ranks of every residual and velocity -- from every rank's own ``state``
    (collective; summed in float64, the same bits on every rank).  Ranks whose
    states differ in step or in which arrays they hold raise ``ValueError``."""
    names = [(group, name) for group in _ARRAY_GROUPS for name in sorted(state.get(group, {}))]
    arrays = [np.asarray(state[group][name], dtype=np.float32) for group, name in names]
    signature = np.array([int(state.get("step", 0)), len(names),
                          sum(a.size for a in arrays), _crc(repr(names))], dtype=np.int64)
    table = comm.allgather_host(signature)
    if (table != table[0]).any():
        raise ValueError(f"the ranks' compressor states differ (step, arrays, elements, "
                         f"names per rank: {table.tolist()}); they cannot be averaged")
    total = comm.allreduce_host(np.concatenate([a.ravel() for a in arrays])) if table[0, 2] \
        else np.zeros(0)
    mean = (total / comm.size).astype(np.float32)
    merged, start = {"step": int(state.get("step", 0))}, 0
    for (group, name), array in zip(names, arrays):
        merged.setdefault(group, {})[name] = mean[start:start + array.size].reshape(array.shape)
        start += array.size
    for group in _ARRAY_GROUPS:
        if group in state:
            merged.setdefault(group, {})
    return merged


def broadcast(state, comm, root=0):
    """``root``'s ``state`` (a dict, or ``None``) on every rank (collective)."""
    data = np.frombuffer(encode({} if state is None else state), dtype=np.uint8) \
        if comm.rank == root else np.zeros(0, dtype=np.uint8)
    length = comm.broadcast_host(np.array([data.size, state is None], dtype=np.int64), root)
    padded = np.zeros(int(length[0]), dtype=np.uint8)
    padded[:data.size] = data
    received = comm.broadcast_host(padded, root)
    return None if length[1] else decode(received.tobytes())


def localize(state, rank, size):
    """Rank ``rank`` of ``size``'s state from a gathered or an own state.

    An own state stamped with another rank or rank count raises ``ValueError``:
    its residuals are another rank's, and the carry-over needs all of them."""
    if "ranks" not in state:
        saved = state.get("rank", rank), state.get("size", size)
        if saved != (rank, size):
            raise ValueError(
                f"this compressor state is rank {saved[0]} of {saved[1]}'s own; rank {rank} of "
                f"{size} cannot resume from it (residuals are per rank).  For a checkpoint that "
                "rank 0 writes alone, call state_dict(all_ranks=True) on every rank and save "
                "that; or save and load one file per rank")
        return state
    ranks = state["ranks"]
    if len(ranks) == size:
        return ranks[rank]
    merged = {"step": ranks[0]["step"]}
    for group in _ARRAY_GROUPS:
        if group in ranks[0]:
            merged[group] = {name: np.mean([s[group][name] for s in ranks], axis=0,
                                           dtype=np.float64).astype(np.float32)
                             for name in ranks[0][group]}
    return merged


def _crc(text):
    return zlib.crc32(text.encode())


def _npz(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()
