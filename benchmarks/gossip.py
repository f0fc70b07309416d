"""Gossip vs allreduce on the bundled digits data: Crossover-SGD (flat and
hierarchical), SGP and AllReduce-SGD (Horovod's DistributedOptimizer), at a
small and at a large global batch, on one job.

    horovodrun -np 4 python benchmarks/gossip.py

Rank 0 writes ``docs/gossip.md`` (accuracy of rank 0's model, disagreement
between the ranks' models, time per epoch, bytes per step), ``docs/gossip.csv``
(accuracy per epoch) and ``docs/gossip.png``.  ``--quick`` trains two epochs
and writes nothing.
"""

import argparse
import os
import sys

import numpy as np
import horovod.torch as hvd

from common import DENSE, row_options, rows
from report import DOCS, Table, figure, provenance, write_csv, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
LABELS = {DENSE: "AllReduce-SGD (dense)", "crossover": "Crossover-SGD",
          "hierarchical": "Crossover-SGD, 2 groups", "sgp": "SGP"}


class Task:
    """How a task trains and what its page reports (``quality`` per ``x``)."""

    def __init__(self, args):
        self.charlm = args.task == "charlm"
        if self.charlm:
            from charlm import train
            self.train = lambda row, batch, lr: train(row_options(row)[0], steps=args.steps,
                                                         batch_size=batch, lr=lr, verbose=False)
            self.x, self.quality, self.label = "step", "bpc", "validation bits/char"
            self.series = lambda r: [point["bpc"] for point in r["curve"]]
            self.xs = lambda r: [point["step"] for point in r["curve"]]
        else:
            from digits import train
            self.train = lambda row, batch, lr: train(row_options(row)[0], epochs=args.epochs,
                                                         batch_size=batch, lr=lr, verbose=False)
            self.x, self.quality, self.label = "epoch", "accuracy", "test accuracy"
            self.series = lambda r: r["accuracies"]
            self.xs = lambda r: list(range(1, len(r["accuracies"]) + 1))

    def final(self, r):
        """Accuracy: mean of the last 5 epochs; bits/char: of the last two evaluations."""
        return r["bpc"] if self.charlm else float(np.mean(r["accuracies"][-5:]))

    def versus(self, r, base):
        if self.charlm:
            return f"{100 * (self.final(r) / self.final(base) - 1):+.1f} %"
        return f"{100 * (self.final(r) - self.final(base)):+.2f}"

    def cell(self, r):
        return f"{self.final(r):.3f}" if self.charlm else f"{100 * self.final(r):.2f} %"


def write(runs, args, task):
    name = "gossip_charlm" if task.charlm else "gossip"
    write_csv(name + ".csv", [task.x] + [f"{r['method']}@{r['global_batch']}" for r in runs],
              ([x] + [f"{task.series(r)[i]:.4f}" for r in runs]
               for i, x in enumerate(task.xs(runs[0]))))
    with figure(name + ".png", 1, 2, figsize=(11, 4), sharey=True) as axes:
        for axis, batch in zip(axes, sorted({r["global_batch"] for r in runs})):
            for r in (r for r in runs if r["global_batch"] == batch):
                axis.plot(task.xs(r), task.series(r), label=LABELS[r["method"]])
            axis.set(xlabel=task.x, title=f"global batch {batch}",
                     ylim=(1.5, 4.5) if task.charlm else (0.8, 1.0))
            axis.legend()
        axes[0].set_ylabel(f"{task.label} (rank 0's model)")
    what = (f"Language model of `examples/charlm.py` ({runs[0]['parameters']:,} parameters), "
            f"{args.steps} steps, SGD momentum 0.9, cosine decay, gradient norm clipped to 1 "
            "(under gossip each rank clips its own); " if task.charlm else
            f"Digits MLP ({runs[0]['parameters']:,} parameters), SGD momentum 0.9, cosine decay; ")
    how = ("Bits/char: rank 0's model on the validation windows, mean of the last two "
           "evaluations" if task.charlm else "Accuracy: rank 0's model, mean of the last 5 epochs")
    for r in runs:
        r["base"] = next(b for b in runs if b["method"] == DENSE
                         and b["global_batch"] == r["global_batch"])
    lines = ["# Gossip (Crossover-SGD, SGP) vs AllReduce-SGD"
             + (" on the language model" if task.charlm else ""), "",
             provenance(f"horovodrun -np {hvd.size()} python benchmarks/gossip.py --task "
                        f"{args.task} " + (f"--steps {args.steps}" if task.charlm else
                                            f"--epochs {args.epochs}"))
             + ". " + what + f"batch {args.batch} per rank at lr {args.lr}, and "
             f"{args.large_batch} per rank at lr {args.large_lr}. {how}; disagreement: max "
             "|x_r - mean_r x| over the parameters at the end.", "",
             *Table(("method", lambda r: LABELS[r["method"]], ""),
                    ("global batch", "global_batch", "d"), (task.label, task.cell, ">"),
                    ("vs AllReduce", lambda r: task.versus(r, r["base"]), ">"),
                    ("disagreement", "disagreement", ".2e"), ("step ms", "step_ms", ".1f"),
                    ("bytes/step", "bytes_per_step", ",.0f")).markdown(runs),
             "", "Every run uses `hvd.init(process_sets=\"dynamic\")` (the hierarchical mode "
             "registers its groups), which on this machine makes every Horovod collective "
             f"slower, and {hvd.size()} ranks share {os.cpu_count()} cores: compare the times "
             "with each other, not with a cluster. The hierarchical mode adds a collective a "
             "step (the group allreduce) and its leaders send the model to their group; its "
             "point is that the in-group allreduce runs on fast local links.", "",
             f"![gossip]({name}.png)", ""]
    write_page(name + ".md", lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("digits", "charlm"), default="digits")
    parser.add_argument("--epochs", type=int, default=40, help="digits")
    parser.add_argument("--steps", type=int, default=200, help="charlm")
    parser.add_argument("--methods", default="dense,crossover,hierarchical,sgp",
                        help="comma-separated; dense (or none) = AllReduce-SGD")
    parser.add_argument("--batch", type=int, help="per rank (digits 16, charlm 4)")
    parser.add_argument("--lr", type=float, help="(digits 0.05, charlm 3.0)")
    parser.add_argument("--large-batch", type=int, help="per rank (digits 64, charlm 16)")
    parser.add_argument("--large-lr", type=float, help="(digits 0.2: linear scaling; charlm "
                        "6.0: square-root scaling, the gradient being clipped)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    defaults = ((4, 3.0, 16, 6.0) if args.task == "charlm" else (16, 0.05, 64, 0.2))
    for key, default in zip(("batch", "lr", "large_batch", "large_lr"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.quick:
        args.epochs, args.steps = 2, 20
    task = Task(args)
    hvd.init(process_sets="dynamic")
    runs = []
    for batch, lr in ((args.batch, args.lr), (args.large_batch, args.large_lr)):
        for method in rows(args.methods):
            run = {**task.train(method, batch, lr), "method": method,
                   "global_batch": batch * hvd.size()}
            runs.append(run)
            if hvd.rank() == 0:
                print(f"{LABELS[method]:>24} @ {run['global_batch']:4d}: {task.quality} "
                      f"{task.final(run):.4f}, disagreement {run['disagreement']:.2e}, "
                      f"{run['step_ms']:.1f} ms/step, {run['bytes_per_step']:,.0f} B/step",
                      flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(runs, args, task)


if __name__ == "__main__":
    main()
