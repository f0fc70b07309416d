"""Rank program (mpirun): the core over mpi4py and numpy, every case of the harness."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import SHAPES, dyadic_gradient  # noqa: E402
from harness import layout_of, record_of  # noqa: E402
from records import report  # noqa: E402

from horovod_sparse.core import GradientExchange, NumpyOps, create  # noqa: E402
from horovod_sparse.mpi import MpiCommunicator  # noqa: E402


def main():
    out, steps, seed, density = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    cases = json.loads(sys.argv[5])
    comm = MpiCommunicator()
    layout = layout_of(SHAPES)
    for index, (method, options) in enumerate(cases):
        exchange = GradientExchange(create(method, density=density, **options), NumpyOps(), comm)
        rows = {"aggregate": [], "residual": [], "counts": [], "nnz": [], "threshold": [], "edges": [],
                "velocity": []}
        for step in range(steps):
            flat = dyadic_gradient(seed, step, comm.rank)
            record = record_of(exchange, exchange.step([flat[s:e] for s, e in layout.bounds], layout),
                               layout)
            for key in rows:
                rows[key].append(record.get(key, []))
        report(out, comm.rank, f"case{index}",
               **{key: np.array(value) for key, value in rows.items()})


if __name__ == "__main__":
    main()
