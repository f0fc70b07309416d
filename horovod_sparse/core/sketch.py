"""Count Sketch of a flat vector (Charikar, Chen & Farach-Colton, 2002), after the
``CSVec`` class of Sketched-SGD (Ivkin et al., NeurIPS 2019).

A table of ``rows x columns`` buckets; coordinate ``i`` adds
``s_r(i) * x_i`` to bucket ``h_r(i)`` of every row ``r``, with
``h_r(i) = ((a_r i + b_r) mod p) mod columns`` and
``s_r(i) = +1 or -1`` by the parity of ``(c_r i + d_r) mod p``, ``p = 2**31 - 1``
and ``a_r, b_r, c_r, d_r`` drawn from ``seed``.  Every rank built from the same
seed hashes alike, so sketches of different vectors add (the sketch is
linear): the sum of the ranks' tables is the sketch of the summed vector.
The estimate of ``x_i`` is the median over rows of ``s_r(i) * table[r, h_r(i)]``.
Tables are flat vectors of ``rows * columns`` elements (row-major) so a
communicator can allreduce them as they are.
"""

import numpy as np

from .ops import HASH_PRIME

CHUNK = 1 << 18  # coordinates hashed at a time (bounds the int64 temporaries)


def hash_coefficients(seed, rows):
    """``rows x 4`` integers ``(a, b, c, d)`` in ``[1, p)``, identical for one seed."""
    return np.random.default_rng(seed).integers(1, HASH_PRIME, size=(rows, 4)).tolist()


class CountSketch:
    def __init__(self, ops, rows, columns, seed):
        self.ops, self.rows, self.columns = ops, rows, columns
        self.coefficients = hash_coefficients(seed, rows)

    def _row_hashes(self, start, stop, like):
        """Per row: (flat table positions, signs) of the coordinates ``[start, stop)``."""
        for row, (a, b, c, d) in enumerate(self.coefficients):
            buckets = self.ops.hash_range(start, stop, a, b, self.columns, like)
            yield buckets + row * self.columns, self.ops.hash_signs(start, stop, c, d, like)

    def encode(self, x, n):
        """The sketch table of ``x[0:n]``: a new flat vector of ``rows * columns``."""
        table = self.ops.zeros(self.rows * self.columns, x)
        for start in range(0, n, CHUNK):
            stop = min(start + CHUNK, n)
            for positions, signs in self._row_hashes(start, stop, x):
                self.ops.add_at(table, positions, self.ops.multiply(x[start:stop], signs))
        return table

    def estimate(self, table, start, stop):
        """Median-of-rows estimates of the coordinates ``[start, stop)``."""
        parts = []
        for first in range(start, stop, CHUNK):
            last = min(first + CHUNK, stop)
            parts.append(self.ops.median_rows([
                self.ops.multiply(self.ops.take(table, positions), signs)
                for positions, signs in self._row_hashes(first, last, table)]))
        return self.ops.concat(parts) if parts else table[:0]
