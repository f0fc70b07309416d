"""The consistency guard: are the parameters bit-identical on every rank?

Each rank hashes every tensor's bytes (BLAKE2b, 8 bytes) and the ranks
allgather the digests (8 bytes a tensor, not the model); on a difference every
rank raises :class:`ParameterDivergenceError` naming the first differing
tensor.  The adapters hand in each tensor's raw bytes.
"""

import hashlib

import numpy as np

from .errors import ModelMismatchError, ParameterDivergenceError


def digest(data):
    """64-bit digest of a bytes-like object, as a signed integer."""
    return int(np.frombuffer(hashlib.blake2b(data, digest_size=8).digest(), dtype=np.int64)[0])


def check_identical(names, byte_views, comm):
    """Raise on every rank unless every rank holds the same bytes for ``names``."""
    digests = np.array([digest(view) for view in byte_views], dtype=np.int64)
    counts = comm.allgather_host(np.array([len(digests)], dtype=np.int64))[:, 0]
    if (counts != counts[0]).any():
        raise ModelMismatchError(f"ranks hold different numbers of parameters: {counts.tolist()}")
    table = comm.allgather_host(digests)
    differing = np.flatnonzero((table != table[0]).any(axis=0))
    if differing.size:
        first = int(differing[0])
        raise ParameterDivergenceError(names[first],
                                       np.flatnonzero(table[:, first] != table[0, first]).tolist())
