"""Gradient exchange time of every method against dense allreduce, on real ranks.

    horovodrun -np 4 python benchmarks/sparse_allreduce.py
    mpirun -np 4 python benchmarks/sparse_allreduce.py --communicator mpi

Two gradient sources, each rank exchanging its own gradient:

* ``model``: gradients of a real training run, produced live.  A
  25.5M-parameter MLP (64-4096-4096-2048-10) trains on the rank's shard of
  the bundled digits data (batch 16, plain SGD) with dense averaged
  gradients, so every method sees the same real trajectory; each step's
  local gradient (flattened) also goes through the method's exchange, with
  its own error feedback.
* ``synthetic``: a heavy-tailed stream, ``--elements`` long (Student-t,
  3 dof, a per-rank base vector rescaled every step).

Every method runs the core path its adapter uses (``--communicator
horovod``: ``TorchOps`` and Horovod collectives, as ``horovod_sparse.torch``;
``mpi``: ``NumpyOps`` and mpi4py, as the MPI scripts), and dense is the
framework's allreduce of the same vector.  Reported per step, median over
the measured steps after warm-up, on rank 0: selection and communication
time (the method's own timers) and their sum (the exchange time), the whole
``step`` (also the accumulate and the dense output), bytes sent + received
per worker, density error, build-up and imbalance.  Writes
``docs/sparse_allreduce.md`` and ``.png`` (``sparse_allreduce_mpi.*`` with
``--communicator mpi``) unless ``--quick``.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from horovod_sparse.core import GradientExchange, Layout, NumpyOps
from common import DENSE, create_row, method_rows, oversubscription_note, rows
from report import DOCS, Table, figure, provenance, summarize, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
METHODS = ",".join(method_rows())


class HorovodBackend:
    """Horovod collectives on torch tensors (what ``hvd.DistributedOptimizer`` uses)."""

    def __init__(self):
        import horovod.torch as hvd
        from horovod_sparse.torch.comm import HorovodTorchCommunicator
        from horovod_sparse.torch.ops import TorchOps
        hvd.init()
        self.hvd, self.rank, self.size = hvd, hvd.rank(), hvd.size()
        self.local_size = hvd.local_size()
        # horovodrun --gloo sets the rendezvous address; mpirun does not
        controller = "Gloo" if os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") else "MPI"
        self.name = f"Horovod, {controller} controller"
        self.exchange = lambda sparsifier: GradientExchange(sparsifier, TorchOps(),
                                                            HorovodTorchCommunicator())

    def vector(self, tensor):
        return tensor

    def average(self, vector):
        return self.hvd.allreduce(vector, op=self.hvd.Average, name="dense")


class MpiBackend:
    """mpi4py collectives on numpy vectors (``mpirun`` scripts)."""

    name = "mpi4py (Open MPI)"

    def __init__(self):
        from mpi4py import MPI
        from horovod_sparse.mpi import MpiCommunicator
        self.mpi, self.world = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        self.local_size = self.world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
        self.exchange = lambda sparsifier: GradientExchange(sparsifier, NumpyOps(),
                                                            MpiCommunicator())

    def vector(self, tensor):
        return tensor.numpy()

    def average(self, vector):
        total = np.empty_like(vector)
        self.world.Allreduce(vector, total, op=self.mpi.SUM)
        return torch.from_numpy(total / self.size)


def model_gradients(backend, steps, hidden, dense_times):
    """Yield this rank's flat gradient at each of ``steps`` steps of dense training;
    append each step's dense averaging time to ``dense_times``."""
    from digits_common import load_split
    torch.manual_seed(0)  # the same initial model on every rank
    widths = [64, *hidden, 10]
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    x_train, y_train = (torch.from_numpy(a) for a in load_split(0)[:2])
    x_shard, y_shard = x_train[backend.rank::backend.size], y_train[backend.rank::backend.size]
    parameters = list(model.parameters())
    generator = torch.Generator().manual_seed(backend.rank)
    for _ in range(steps):
        batch = torch.randint(0, len(y_shard), (16,), generator=generator)
        model.zero_grad()
        F.cross_entropy(model(x_shard[batch]), y_shard[batch]).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])
        yield backend.vector(flat)
        start = time.perf_counter()
        average = backend.average(backend.vector(flat))
        dense_times.append(time.perf_counter() - start)
        with torch.no_grad():
            offset = 0
            for p in parameters:
                p.sub_(0.05 * average[offset:offset + p.numel()].view_as(p))
                offset += p.numel()


def synthetic_gradients(backend, steps, elements, dense_times):
    """Yield a rescaled heavy-tailed base vector (per rank) ``steps`` times;
    time a dense average of each."""
    base = torch.from_numpy(np.random.default_rng(backend.rank).standard_t(3, elements)
                            .astype(np.float32))
    for step in range(steps):
        grad = backend.vector(base * (1.0 + 0.5 * np.sin(step)))
        yield grad
        start = time.perf_counter()
        backend.average(grad)
        dense_times.append(time.perf_counter() - start)


def run(backend, source, method, args):
    """One row: ``method`` (or ``dense``) on ``source``'s gradients."""
    dense_times = []
    steps = args.warmup + args.steps
    stream = (model_gradients(backend, steps, args.hidden, dense_times) if source == "model" else
              synthetic_gradients(backend, steps, args.elements, dense_times))
    exchange = None
    step_times = []
    for grad in stream:
        if method == DENSE:
            continue
        if exchange is None:
            exchange = backend.exchange(create_row(method, density=args.density))
            layout = Layout(("gradient",), ((len(grad),),), ("torch.float32",))
        start = time.perf_counter()
        exchange.step([grad], layout)
        step_times.append(time.perf_counter() - start)
    dense_ms = 1e3 * np.median(dense_times[args.warmup:])
    if method == DENSE:
        return {"method": DENSE, "n": len(grad), "selection_ms": 0.0, "communication_ms": dense_ms,
                "exchange_ms": dense_ms, "step_ms": dense_ms, "bytes_per_step": 8.0 * len(grad),
                "density_error": 0.0, "buildup": 1.0, "imbalance": 0.0}
    return {"method": method, "n": len(grad), "step_ms": 1e3 * np.median(step_times[args.warmup:]),
            **summarize(list(exchange.history)[args.warmup:], times=np.median)}


def exchange_table(rows):
    """The columns of a source's rows, with exchange-time ratios to dense's and top-k's."""
    def ratio(name):
        reference = next((r for r in rows if r["method"] == name), None)
        return lambda r: (f"{reference['exchange_ms'] / r['exchange_ms']:.1f}x"
                          if reference and r["exchange_ms"] else "nan")
    return Table(("method", "method", ""), ("exchange ms", "exchange_ms", ".1f"),
                 ("selection ms", "selection_ms", ".1f"),
                 ("communication ms", "communication_ms", ".1f"), ("step ms", "step_ms", ".1f"),
                 ("bytes / worker", "bytes_per_step", ",.0f"),
                 ("density error", "density_error", ".4f"), ("build-up", "buildup", ".3f"),
                 ("imbalance", "imbalance", ".3f"), ("dense / x", ratio(DENSE), ">"),
                 ("topk / x", ratio("topk"), ">"))


def write_docs(results, args, backend):
    launcher = "horovodrun" if args.communicator == "horovod" else "mpirun"
    methods = "" if args.methods == METHODS else f" --methods {args.methods}"
    lines = ["# Sparse gradient exchange vs dense allreduce", "",
             provenance(f"{launcher} -np {backend.size} python benchmarks/sparse_allreduce.py "
                        f"--communicator {args.communicator} --density {args.density}{methods} "
                        f"--steps {args.steps} --warmup {args.warmup}", backend.name,
                        f"{backend.size} ranks on one machine")
             + f". Median per step over {args.steps} steps after "
             f"{args.warmup} warm-up steps, rank 0. **exchange** = selection + communication (the "
             "method's own timers; dense: the allreduce); **step** = the whole "
             "`GradientExchange.step` (also accumulating the residual and writing the dense "
             "output). Bytes: logical payload sent + received per worker (dense: the vector "
             "once each way). dense / x and topk / x: exchange-time ratios. topk/union: "
             "Top-k's union variant (the MiCRO, ExDyna and DEFT papers' baseline: index "
             "lists allgathered, every rank's values allreduced at their union).", ""]
    for source, source_rows in results.items():
        n = source_rows[0]["n"]
        title = (f"Real gradients: digits MLP {'-'.join(map(str, [64, *args.hidden, 10]))}, "
                 f"n = {n:,}, dense SGD trajectory" if source == "model" else
                 f"Synthetic heavy-tailed stream, n = {n:,}")
        table = exchange_table(source_rows)
        lines += [f"## {title}", "", *table.markdown(source_rows), ""]
    stem = "sparse_allreduce" if args.communicator == "horovod" else "sparse_allreduce_mpi"
    write_page(stem + ".md", lines + [f"![exchange time]({stem}.png)", ""])
    with figure(stem + ".png", 1, len(results), figsize=(6 * len(results), 4),
                squeeze=False) as axes:
        for axis, (source, source_rows) in zip(axes[0], results.items()):
            names = [r["method"] for r in source_rows]
            axis.bar(names, [r["selection_ms"] for r in source_rows], label="selection")
            axis.bar(names, [r["communication_ms"] for r in source_rows],
                     bottom=[r["selection_ms"] for r in source_rows], label="communication")
            axis.set(yscale="log", ylabel="ms per step",
                     title=f"{source}, n = {source_rows[0]['n']:,}")
            axis.tick_params(axis="x", rotation=60)
            axis.legend()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--communicator", choices=("horovod", "mpi"), default="horovod")
    parser.add_argument("--sources", default="model,synthetic", help="model and/or synthetic")
    parser.add_argument("--elements", type=int, default=25_600_000, help="synthetic vector length")
    parser.add_argument("--hidden", default="4096,4096,2048", help="hidden widths of the model")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 steps, no files")
    args = parser.parse_args()
    if args.quick:
        args.elements, args.hidden, args.steps, args.warmup = 200_000, "256,256", 2, 1
    args.hidden = [int(h) for h in args.hidden.split(",")]
    torch.set_num_threads(1)
    backend = HorovodBackend() if args.communicator == "horovod" else MpiBackend()
    note = oversubscription_note(backend.local_size)
    if note and backend.rank == 0:
        print(note, flush=True)
    results = {}
    for source in args.sources.split(","):
        source_rows = results[source] = []
        if backend.rank == 0:
            print(f"# {source} gradients\n{exchange_table([]).header()}", flush=True)
        for method in [DENSE, *(row for row in rows(args.methods) if row != DENSE)]:
            source_rows.append(run(backend, source, method, args))
            if backend.rank == 0:
                print(exchange_table(source_rows).line(source_rows[-1]), flush=True)
    if backend.rank == 0 and not args.quick:
        write_docs(results, args, backend)


if __name__ == "__main__":
    main()
