"""Per-worker selection cost of every method next to two references, single process.

    python benchmarks/selection_cost.py            # n in {1M, 10M, 25.6M}, d in {0.01, 0.001}, P in {4, 8, 16, 64}

One process plays one worker of ``P``: every method runs its own exchange
(``GradientExchange`` with ``TorchOps``, the PyTorch adapter's path) on a
heavy-tailed stream (Student-t, 3 dof, its scale drifting by up to 20 % as
training gradients do, error feedback on), and the time is the method's own
selection timer (the work between its collectives; MiCRO's and ExDyna's
candidate scan, which a training step makes inside the accumulating pass,
is timed as a pass of its own here).  The ``P - 1`` peers are mirror images
of this worker (:class:`MirroredPeers`): each collective returns what ``P`` workers holding
this worker's data would return, so thresholds, ladders and partitions
behave as in a ``P``-worker job while only this worker's work is timed.
Next to them, from the same run and the same vector:

* ``topk(n)``: ``torch.topk`` of the magnitudes over the whole vector;
* ``read(n/P)``: one read of the worker's share from memory
  (``share.sum()``: no output to allocate, so no page faults in the
  figure), the practical floor.  A pass over ``EVICT_BYTES`` before each
  read pushes the share out of the caches, as it is for a method: its
  ``acc`` was just formed over all ``n`` (100 MB at the largest size), so
  its share comes from memory too.  (Read again from the last-level
  cache, a 12.8 MB share takes about half as long.)

Notes on the roles: hard threshold gets the threshold that selects ``k`` of
the stream's base vector (its default ``1/(2 sqrt(k))`` is not tied to the
gradient's scale and would select most of it); CLT-k is timed on the step's leader (rank ``t mod P``,
whom every worker waits for); gTop-k's ``ceil(log2 P)`` merges of ``2k``
elements are not in its figure (a mirrored partner sends nothing to merge;
they cost ``O(k log P)``, small next to its top-k over ``n``).

Prints milliseconds and ratios; writes ``docs/selection_cost.md`` and
``docs/selection_cost.png``.  ``--quick`` runs one small size (smoke test).
"""

import argparse

import numpy as np
import torch

from horovod_sparse.core import GradientExchange, Layout, available, create
from horovod_sparse.core.comm import Communicator
from horovod_sparse.torch.ops import TorchOps
from common import best_ms
from report import Table, figure, provenance, write_page


class MirroredPeers(Communicator):
    """Rank ``rank`` of ``size`` workers that all hold this process's data.

    allgather: ``size`` copies; allreduce: ``size`` times the vector;
    broadcast: the vector itself; alltoall: from every peer, the slice this
    worker addresses to itself.  Metering is the base class's.
    """

    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size = rank, size

    def _numel(self, x):
        return x.numel()

    def _itemsize(self, x):
        return x.element_size()

    def _allgather(self, x, counts):
        return torch.cat([x] * self.size)

    def _allreduce_sum(self, x):
        return x * self.size

    def _broadcast(self, x, root):
        return x.clone()

    def _alltoall(self, x, splits):
        start = sum(splits[:self.rank])
        own = x[start:start + splits[self.rank]]
        return torch.cat([own] * self.size), [len(own)] * self.size

    def _allgather_host(self, array):
        return np.stack([array] * self.size)

    def _broadcast_host(self, array, root):
        return array.copy()


EVICT_BYTES = 1 << 27  # four times this machine's last-level cache (32 MiB)
_EVICTION = None


def evict_caches():
    """Read ``EVICT_BYTES`` of other data, so that what was read before is in memory only."""
    global _EVICTION
    if _EVICTION is None:
        _EVICTION = torch.ones(EVICT_BYTES // 4)
    _EVICTION.sum()


def method_selection_ms(method, base, density, size, warmup, repeats):
    """Best selection time (ms) of ``method``'s own exchange over ``repeats`` steps
    after ``warmup`` steps, as one worker of ``size`` mirrored workers."""
    comm = MirroredPeers(0, size)
    layout = Layout(("gradient",), ((base.numel(),),), ("torch.float32",))
    options = {}
    if method == "threshold":  # its default 1/(2 sqrt(k)) would select most of this stream
        k = max(1, int(density * base.numel()))
        options["threshold"] = float(torch.topk(base.abs(), k).values[-1])
    exchange = GradientExchange(create(method, density=density, **options), TorchOps(), comm)
    # A training step collects MiCRO's and ExDyna's candidates inside the accumulating pass,
    # beyond the selection timer's sight; here they scan acc as a pass of its own.
    exchange.sparsifier.scan_request = lambda *request: None
    times = []
    for step in range(warmup + repeats):
        if method == "cltk":
            comm.rank = step % size  # always the leader
        exchange.step([base * (1.0 + 0.2 * np.sin(step / 3))], layout)
        times.append(exchange.metrics.selection_time)
    return 1e3 * min(times[warmup:])


def measure(n, density, size, methods, warmup, repeats):
    base = torch.from_numpy(np.random.default_rng(0).standard_t(3, n).astype(np.float32))
    k = max(1, int(density * n))
    share = base[:n // size]
    row = {"n": n, "density": density, "P": size,
           "topk_n": best_ms(lambda: torch.topk(base.abs(), k), repeats),
           "read_share": best_ms(share.sum, repeats, before=evict_caches)}
    for method in methods:
        row[method] = method_selection_ms(method, base, density, size, warmup, repeats)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small size, no files written")
    parser.add_argument("--sizes", default="1000000,10000000,25600000")
    parser.add_argument("--densities", default="0.01,0.001")
    parser.add_argument("--workers", default="4,8,16,64")
    parser.add_argument("--methods", default=",".join(available()))
    parser.add_argument("--warmup", type=int, default=2, help="steps before timing (thresholds settle)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps; the best is reported")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.densities, args.workers, args.warmup, args.repeats = "200000", "0.01", "4", 1, 1
    torch.set_num_threads(1)
    methods = args.methods.split(",")
    table = Table(("n", "n", ","), ("d", "density", ">"), ("P", "P", "d"),
                  ("topk(n)", "topk_n", ".2f"), ("read n/P", "read_share", ".2f"),
                  *((m, m, ".2f") for m in methods))
    rows = []
    print(table.header(), flush=True)
    for n in map(int, args.sizes.split(",")):
        for density in map(float, args.densities.split(",")):
            for size in map(int, args.workers.split(",")):
                rows.append(measure(n, density, size, methods, args.warmup, args.repeats))
                print(table.line(rows[-1]), flush=True)
    # The partition methods' times as multiples of the two references.
    partition = [m for m in ("micro", "exdyna") if m in methods]
    ratios = partition and Table(*table.columns[:3], *(column for m in partition for column in (
        (f"{m} / read", lambda r, m=m: r[m] / r["read_share"], ".2f"),
        (f"topk(n) / {m}", lambda r, m=m: r["topk_n"] / r[m], ".1f"))))
    if ratios:
        print("\n".join([ratios.header(), *map(ratios.line, rows)]))
    if not args.quick:
        write_docs(rows, methods, table, ratios, args)


def write_docs(rows, methods, table, ratios, args):
    lines = ["# Selection cost per worker", "",
             provenance("python benchmarks/selection_cost.py", "one torch thread",
                        f"torch {torch.__version__}")
             + ". Milliseconds per step: each method's own selection timer in its exchange, as "
             f"one worker of P mirrored workers (see the script's docstring), best of "
             f"{args.repeats} steps after {args.warmup} warm-up steps; the references best of "
             f"{args.repeats}. Student-t (3 dof) float32 gradient stream. `topk(n)`: `torch.topk` "
             "over the whole vector; `read`: one read (`sum`) of the worker's n/P share from "
             f"memory (the caches flushed by a read of {EVICT_BYTES >> 20} MiB before each).", "",
             *table.markdown(rows)]
    if ratios:
        lines += ["", "Ratios of the partition methods to the two references:", "",
                  *ratios.markdown(rows)]
    write_page("selection_cost.md", lines + ["", "![selection cost](selection_cost.png)", ""])
    largest = max(r["n"] for r in rows)
    picked = [r for r in rows if r["n"] == largest and r["density"] == min(x["density"] for x in rows)]
    with figure("selection_cost.png", figsize=(8, 5)) as axis:
        for name, style in (("topk_n", "k-"), ("read_share", "k:")):
            axis.plot([r["P"] for r in picked], [r[name] for r in picked], style,
                      label={"topk_n": "torch.topk(n)", "read_share": "one read n/P"}[name])
        for index, method in enumerate(methods):
            axis.plot([r["P"] for r in picked], [r[method] for r in picked], "o-",
                      color=f"C{index}", label=method)
        axis.set(xscale="log", yscale="log", xlabel="workers P", ylabel="ms per worker per step",
                 title=f"selection, n = {largest:,}, d = {picked[0]['density']}")
        axis.legend(fontsize=8, ncol=2)


if __name__ == "__main__":
    main()
