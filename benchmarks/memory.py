"""Extra memory of the sparse step, per method, in gradient sizes.

    python benchmarks/memory.py            # writes docs/memory.md

Two ranks simulated in one process (threads and ``SimulatedCommunicator``)
run every method with ``NumpyOps`` -- the kernels a CPU torch gradient uses
too -- on an ``n``-element synthetic gradient.  ``tracemalloc`` (numpy
reports its buffers to it) measures, after warm-up steps, the memory the
exchange keeps between steps (residual and spare buffer, which hold the
step's output too; velocity) and the peak during a step, both per rank and in units of one
float32 gradient (``4n`` bytes).  The gradients themselves are allocated
before measuring and not counted; a small run of each method first keeps
one-time costs (numba loading its compiled kernels, ~11 MB) out of the
figures.
"""

import argparse
import sys
import tracemalloc

import numpy as np

from horovod_sparse import available, create
from horovod_sparse.core import GradientExchange, Layout, NumpyOps, run_simulated
from report import Table, provenance, write_page

RANKS = 2


def measure(method, n, density, steps=3):
    layout = Layout(names=("w",), shapes=((n,),), dtypes=("float32",))
    grads = [[np.random.default_rng([rank, t]).standard_t(3, n).astype(np.float32)
              for t in range(steps + 1)] for rank in range(RANKS)]
    exchanges = {}

    def warm_up(comm):
        exchanges[comm.rank] = GradientExchange(create(method, density=density), NumpyOps(), comm)
        for t in range(steps):
            exchanges[comm.rank].step([grads[comm.rank][t]], layout)

    def one_step(comm):
        exchanges[comm.rank].step([grads[comm.rank][steps]], layout)

    tracemalloc.start()
    run_simulated(RANKS, warm_up)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    run_simulated(RANKS, one_step)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    gradient = 4 * n * RANKS
    return {"method": method, "kept": kept / gradient, "peak": peak / gradient}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4_000_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--quick", action="store_true", help="100K elements, no file")
    args = parser.parse_args()
    if args.quick:
        args.elements = 100_000
    rows = []
    for method in available():
        measure(method, 10_000, args.density)  # untraced one-time costs: numba loads its kernels
        rows.append(measure(method, args.elements, args.density))
        print(f"{method:>9}: kept {rows[-1]['kept']:.2f}, peak {rows[-1]['peak']:.2f} "
              "gradient sizes", flush=True)
    if args.quick:
        return
    lines = ["# Memory of the sparse step", "",
             provenance(f"python benchmarks/memory.py --elements {args.elements} --density "
                        f"{args.density}")
             + f". {RANKS} simulated ranks, "
             "NumpyOps (the CPU kernels torch gradients use), after 3 warm-up steps; per rank, "
             "in float32 gradient sizes (4n bytes), the gradient itself not counted. *kept*: "
             "what the exchange holds between steps (residual and its spare buffer, which also "
             "hold the output Horovod's views need, the velocity under momentum correction); "
             "*peak*: the most during a step.", "",
             *Table(("method", "method", ""), ("kept", "kept", ".2f"),
                    ("peak", "peak", ".2f")).markdown(rows),
             "", "Where it goes: residual + spare `acc` (2n).  `acc = g + e` is formed in "
             "the spare, so a step refused at its header loses nothing; past the header the "
             "old residual is dead and its buffer takes the step's output (`p.grad`'s "
             "storage until the next step forms its `acc` there: no separate output "
             "buffer).  Under momentum correction a velocity and its spare (2n more: DGC, "
             "gs-SGD, whose Count Sketch tables add the rest); "
             "hard-threshold's hits are not bounded by k, so its peak follows how many "
             "magnitudes pass the threshold (here a Student-t gradient, many).  The step's "
             "own temporaries otherwise are index and value lists of a few k.", ""]
    write_page("memory.md", lines)


if __name__ == "__main__":
    sys.exit(main())
