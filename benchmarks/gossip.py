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
import csv
import os
import platform
import sys
import time

import numpy as np
import horovod.torch as hvd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from digits import train  # noqa: E402

DOCS = os.path.join(ROOT, "docs")
LABELS = {"none": "AllReduce-SGD", "crossover": "Crossover-SGD",
          "hierarchical": "Crossover-SGD, 2 groups", "sgp": "SGP"}


def write(runs, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = os.path.join(DOCS, "gossip")
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch"] + [f"{r['method']}@{r['global_batch']}" for r in runs])
        for epoch in range(args.epochs):
            writer.writerow([epoch + 1] + [f"{r['accuracies'][epoch]:.4f}" for r in runs])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, batch in zip(axes, sorted({r["global_batch"] for r in runs})):
        for r in (r for r in runs if r["global_batch"] == batch):
            axis.plot(range(1, args.epochs + 1), r["accuracies"], label=LABELS[r["method"]])
        axis.set(xlabel="epoch", title=f"global batch {batch}", ylim=(0.8, 1.0))
        axis.legend()
    axes[0].set_ylabel("test accuracy (rank 0's model)")
    figure.tight_layout()
    figure.savefig(stem + ".png", dpi=100)
    lines = ["# Gossip (Crossover-SGD, SGP) vs AllReduce-SGD", "",
             f"`horovodrun -np {hvd.size()} python benchmarks/gossip.py --epochs {args.epochs}` "
             f"({platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}). "
             "Digits MLP (85,002 parameters), SGD momentum 0.9, cosine decay; batch "
             f"{args.batch} per rank at lr {args.lr}, and {args.large_batch} per rank at lr "
             f"{args.large_lr} (linear scaling). Accuracy: rank 0's model, mean of the last 5 "
             "epochs; disagreement: max |x_r - mean_r x| over the parameters at the end.", "",
             "| method | global batch | accuracy | vs AllReduce | disagreement | s/epoch | "
             "bytes/step |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        base = next(b for b in runs if b["method"] == "none" and b["global_batch"] == r["global_batch"])
        final, reference = np.mean(r["accuracies"][-5:]), np.mean(base["accuracies"][-5:])
        lines.append(f"| {LABELS[r['method']]} | {r['global_batch']} | {100 * final:.2f} % | "
                     f"{100 * (final - reference):+.2f} | {r['disagreement']:.2e} | "
                     f"{r['epoch_seconds']:.2f} | {r['bytes_per_step']:,.0f} |")
    lines += ["", "Every run uses `hvd.init(process_sets=\"dynamic\")` (the hierarchical mode "
              "registers its groups), which on this machine makes every Horovod collective "
              "slower (the dense digits step takes ~25 ms without it, ~64 ms with it), and "
              "4 ranks share 2 cores: compare the times with each other, not with a cluster. "
              "The hierarchical mode adds a collective a step (the group allreduce) and its "
              "leaders send the model to their group, so it is the slowest here; its point is "
              "that the in-group allreduce runs on fast local links.", "",
              "![gossip](gossip.png)", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--methods", default="none,crossover,hierarchical,sgp")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--large-batch", type=int, default=64)
    parser.add_argument("--large-lr", type=float, default=0.2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs = 2
    hvd.init(process_sets="dynamic")
    runs = []
    for batch, lr in ((args.batch, args.lr), (args.large_batch, args.large_lr)):
        for method in args.methods.split(","):
            run = train(method, epochs=args.epochs, batch_size=batch, lr=lr, verbose=False)
            run["global_batch"] = batch * hvd.size()
            runs.append(run)
            if hvd.rank() == 0:
                print(f"{LABELS[method]:>24} @ {run['global_batch']:4d}: accuracy "
                      f"{run['accuracy']:.4f}, disagreement {run['disagreement']:.2e}, "
                      f"{run['epoch_seconds']:.2f} s/epoch, {run['bytes_per_step']:,.0f} B/step",
                      flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(runs, args)


if __name__ == "__main__":
    main()
