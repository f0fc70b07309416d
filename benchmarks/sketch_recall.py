"""What gs-SGD's sketch can find: Count Sketch recall on a training run's accumulators.

    python benchmarks/sketch_recall.py         # digits MLP, 4 simulated ranks, density 0.001

Trains the digits MLP of ``examples/digits.py`` with gs-SGD (its default
sketch; SGD with the momentum in the compressor, lr 0.05 with cosine decay,
batch 16 per rank, as the convergence pages) on ``P`` simulated ranks in one
process (``core.run_simulated``, numpy ops), and keeps, at a few steps, the
ranks' summed accumulator ``v``: the vector whose top-``k`` the sketch has to
find.  For each column count ``C`` it sketches ``v`` with the method's own
``CountSketch`` (``rows_for(n)`` rows, the method's hashes) and reports

* the bucket noise ``rms(v) sqrt(n / C)``, the typical sum the other
  coordinates add to a coordinate's bucket, as a multiple of ``|v|_(k)``, the
  ``k``-th largest magnitude;
* recall: the fraction of the true top-``k`` among the ``4k`` largest
  estimates (the method's candidates).

A Count Sketch finds the coordinates that stand above its bucket noise (the
l2 heavy hitters, Charikar et al. 2002); below it the candidates are close to
a random draw, and more rows do not help (each row has the same noise).
Writes ``docs/gssgd_recall.md``; ``--quick`` trains two epochs and writes
nothing.
"""

import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from report import DOCS, Table, provenance, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
from digits import load_data, make_model  # noqa: E402
from horovod_sparse.core import GradientExchange, Layout, NumpyOps, run_simulated  # noqa: E402
from horovod_sparse.core.methods.gssgd import GsSGD  # noqa: E402
from horovod_sparse.core.sketch import CountSketch, rows_for  # noqa: E402

BATCH, LR, CANDIDATES = 16, 0.05, 4


class RecordingGsSGD(GsSGD):
    """gs-SGD that keeps a copy of its accumulator at the ``steps`` it is asked for."""

    def __init__(self, steps, **options):
        super().__init__(**options)
        self.steps, self.recorded = steps, {}

    def exchange(self, acc, context):
        if context.step in self.steps:
            self.recorded[context.step] = np.array(acc)
        return super().exchange(acc, context)


def train(args, steps):
    """Train on ``args.ranks`` simulated ranks; ``(rank 0's test accuracy,
    {step: summed accumulator})``."""
    x_train, y_train, x_test, y_test = load_data()

    def worker(comm):
        torch.manual_seed(0)
        model = make_model()
        params = list(model.parameters())
        layout = Layout(names=tuple(f"p{i}" for i in range(len(params))),
                        shapes=tuple(tuple(p.shape) for p in params),
                        dtypes=("float32",) * len(params))
        sparsifier = RecordingGsSGD(steps, density=args.density)
        exchange = GradientExchange(sparsifier, NumpyOps(), comm)
        optimizer = torch.optim.SGD(params, lr=LR)
        x_shard, y_shard = x_train[comm.rank::comm.size], y_train[comm.rank::comm.size]
        generator = torch.Generator().manual_seed(comm.rank)
        for epoch in range(args.epochs):
            for group in optimizer.param_groups:
                group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * epoch / args.epochs))
            order = torch.randperm(len(y_shard), generator=generator)
            for step in range(len(y_shard) // BATCH):
                batch = order[step * BATCH:(step + 1) * BATCH]
                optimizer.zero_grad()
                F.cross_entropy(model(x_shard[batch]), y_shard[batch]).backward()
                aggregate = exchange.step([p.grad.numpy().ravel() for p in params], layout)
                for p, (start, stop) in zip(params, layout.bounds):
                    p.grad = torch.from_numpy(np.array(aggregate[start:stop])).view_as(p)
                optimizer.step()
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        return accuracy, sparsifier.recorded

    torch.set_num_threads(1)
    results = run_simulated(args.ranks, worker, timeout=3600)
    summed = {step: sum(recorded[step] for _, recorded in results) for step in results[0][1]}
    return results[0][0], summed


def recall(v, k, columns, seed=0):
    """``(bucket noise / |v|_(k), fraction of the true top-k among the 4k largest
    estimates)`` of ``v`` sketched in ``rows_for(n) x columns``."""
    n = v.size
    top = np.argsort(-np.abs(v), kind="stable")[:k]
    sketch = CountSketch(NumpyOps(), rows_for(n), columns, seed)
    estimates = sketch.estimate(sketch.encode(v, n), 0, n)
    candidates = np.argsort(-np.abs(estimates), kind="stable")[:CANDIDATES * k]
    noise = float(np.sqrt(np.mean(v.astype(np.float64) ** 2) * n / columns))
    return noise / float(np.abs(v[top]).min()), np.intersect1d(top, candidates).size / k


def write(accuracy, rows, args):
    lines = ["# What gs-SGD's sketch can find", "",
             provenance(f"python benchmarks/sketch_recall.py --density {args.density} --epochs "
                        f"{args.epochs}")
             + ". The digits MLP (`examples/digits.py`) trained with gs-SGD's default sketch on "
             f"{args.ranks} simulated ranks (one process, numpy ops; test accuracy of this run "
             f"{100 * accuracy:.2f} %). At each listed step, `v` is the ranks' summed "
             "accumulator, whose top-k the sketch must find; it is sketched with gs-SGD's own "
             "`CountSketch` (`rows_for(n)` rows) at each column count. *noise / |v|_(k)*: "
             "`rms(v) sqrt(n / C)`, what the other coordinates add to a bucket, over the k-th "
             "largest magnitude. *recall*: the share of the true top-k among the 4k largest "
             "estimates (the candidates). A Count Sketch finds what stands above its noise.", "",
             *Table(("step", "step", "d"), ("n", "n", ","), ("k", "k", "d"),
                    ("top-k share of ‖v‖²", "share", ".3f"),
                    ("columns C", lambda r: f"{r['columns']:,} ({r['label']})", ">"),
                    ("noise / \\|v\\|_(k)", "noise", ".2f"),
                    ("recall", "recall", ".3f")).markdown(rows), ""]
    write_page("gssgd_recall.md", lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", default="5,100,400", help="steps whose accumulator is sketched")
    parser.add_argument("--multiples", default="4,16,64", help="columns C as multiples of k")
    parser.add_argument("--quick", action="store_true", help="two epochs, nothing written")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.steps = 2, "5"
    steps = {int(step) for step in args.steps.split(",")}
    accuracy, summed = train(args, steps)
    rows = []
    for step, v in sorted(summed.items()):
        k = GsSGD(density=args.density).k(v.size)
        top = np.sort(np.abs(v.astype(np.float64)))[::-1][:k]
        share = float((top ** 2).sum() / (v.astype(np.float64) ** 2).sum())
        for multiple in (int(m) for m in args.multiples.split(",")):
            noise, found = recall(v, k, multiple * k)
            rows.append(dict(step=step, n=v.size, k=k, share=share, columns=multiple * k,
                             label=f"{multiple}k", noise=noise, recall=found))
            print(f"step {step}: C = {multiple}k = {multiple * k:,}: noise / |v|_(k) "
                  f"{noise:.2f}, recall {found:.3f}")
    print(f"test accuracy {accuracy:.4f}")
    if not args.quick:
        write(accuracy, rows, args)


if __name__ == "__main__":
    main()
