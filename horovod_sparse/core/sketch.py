"""Count Sketch of a flat vector (Charikar, Chen & Farach-Colton, 2002), after the
``CSVec`` class of Sketched-SGD (Ivkin et al., NeurIPS 2019).

A table of ``rows x columns`` buckets; coordinate ``i`` adds
``s_r(i) * x_i`` to bucket ``h_r(i)`` of every row ``r``, with

* ``h_r(i) = floor(((a_r i + b_r) mod p) * columns / 2**31)``: a pairwise
  independent bucket, its range reduced by a multiply and a shift;
* ``s_r(i) = +1`` or ``-1`` by the low bit of
  ``(c_r i^3 + d_r i^2 + e_r i + f_r) mod p``: a degree-3 polynomial, so the
  signs are 4-wise independent as in ``CSVec``;

``p = 2**31 - 1`` and the six coefficients of each row drawn from ``seed``.
Every rank built from the same seed hashes alike, so sketches of different
vectors add (the sketch is linear): the sum of the ranks' tables is the sketch
of the summed vector.  The estimate of ``x_i`` is the (lower) median over rows
of ``s_r(i) * table[r, h_r(i)]``.  Tables are flat vectors of
``rows * columns`` elements (row-major) so a communicator can sum them as they
are.

Nothing is cached: a host vector is hashed in registers by the compiled
kernels of :mod:`horovod_sparse.core.kernels` (about 2 ns per coordinate and
row for the hashes, 2 more for the scattered add, on this machine), so a
sketch needs no ``rows x n`` index table; any other vector (a CUDA tensor, a
TensorFlow variable) takes the generic path, which hashes a chunk on the host
and adds it with the framework's own scatter.
"""

import math

import numpy as np

from . import kernels

CHUNK = 1 << 18  # coordinates hashed at a time on the generic path


def hash_coefficients(seed, rows):
    """``rows x 6`` int64 coefficients in ``[1, p)``, identical for one seed:
    ``(a, b)`` of the bucket hash, ``(c, d, e, f)`` of the sign polynomial."""
    return np.random.default_rng(seed).integers(1, kernels.HASH_PRIME, size=(rows, 6),
                                                dtype=np.int64)


def rows_for(n):
    """Default rows: ``ceil(log2(n) / 4)``, at least 3.

    A coordinate's median estimate is off by more than the bucket noise with a
    probability falling as ``exp(-Theta(rows))``, so covering all ``n``
    coordinates takes ``Theta(log n)`` rows (Charikar et al.; Sketched-SGD
    sizes its sketch ``O(k log n)``).  The constant is ours: it keeps the five
    rows measured on the digits model (``n = 85,002``) and gives 7 at 25.6M.
    Every row costs one hashed add per coordinate and step, so rows buy
    accuracy with selection time (docs/methods/gssgd.md)."""
    return max(3, math.ceil(math.log2(max(n, 2)) / 4))


class CountSketch:
    """``rows x columns`` Count Sketch whose hashes are drawn from ``seed``."""

    def __init__(self, ops, rows, columns, seed):
        self.ops, self.rows, self.columns = ops, rows, columns
        self.coefficients = hash_coefficients(seed, rows)

    def encode(self, x, n):
        """The sketch table of ``x[0:n]``: a new flat vector of ``rows * columns``."""
        host = self.ops.host_view(x)
        if host is not None and kernels.sketch_compiled(host):
            table = np.zeros(self.rows * self.columns, np.float32)
            kernels.sketch_encode(host[:n], self.coefficients, self.columns, table)
            return self.ops.from_host(table, x)
        table = self.ops.zeros(self.rows * self.columns, x)
        for start in range(0, n, CHUNK):
            stop = min(start + CHUNK, n)
            for positions, signs in self._row_hashes(start, stop, x):
                self.ops.scatter_add(table, positions, self.ops.multiply(x[start:stop], signs))
        return table

    def estimate(self, table, start, stop):
        """Median-of-rows estimates of the coordinates ``[start, stop)``."""
        host = self.ops.host_view(table)
        if host is not None and kernels.sketch_compiled(host):
            return self.ops.from_host(kernels.sketch_estimate(
                host, start, stop, self.coefficients, self.columns), table)
        parts = []
        for first in range(start, stop, CHUNK):
            last = min(first + CHUNK, stop)
            parts.append(self.ops.median_rows([
                self.ops.multiply(self.ops.take(table, positions), signs)
                for positions, signs in self._row_hashes(first, last, table)]))
        return self.ops.concat(parts) if parts else table[:0]

    def _row_hashes(self, start, stop, like):
        """Per row: (flat table positions, +-1 signs) of the coordinates
        ``[start, stop)``, hashed on the host and moved to ``like``'s device."""
        for row, coefficients in enumerate(self.coefficients):
            buckets, parity = kernels.sketch_positions(start, stop, coefficients, self.columns)
            signs = (1 - 2 * parity).astype(np.float32)
            yield (self.ops.from_host(buckets + row * self.columns, like),
                   self.ops.from_host(signs, like))
