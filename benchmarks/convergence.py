"""Convergence of every method on the bundled digits data, against dense, on one job.

    horovodrun -np 4 python benchmarks/convergence.py --density 0.01

Rank 0 writes ``docs/convergence_<density>.csv`` (test accuracy per epoch),
``docs/convergence_<density>.png`` and ``docs/convergence_<density>.md``
(final accuracy, density, density error, build-up, imbalance, bytes per
step, step time).  ``--quick`` trains two epochs and writes nothing.
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


def write(results, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = os.path.join(DOCS, f"convergence_{args.density}")
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch"] + [r["method"] for r in results])
        for epoch in range(args.epochs):
            writer.writerow([epoch + 1] + [f"{r['accuracies'][epoch]:.4f}" for r in results])
    figure, axis = plt.subplots(figsize=(7, 4))
    for r in results:
        axis.plot(range(1, args.epochs + 1), r["accuracies"], label=r["method"])
    axis.set(xlabel="epoch", ylabel="test accuracy", ylim=(0.8, 1.0),
             title=f"digits MLP, {hvd.size()} ranks, density {args.density}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(stem + ".png", dpi=100)
    dense = results[0]
    lines = [f"# Convergence at density {args.density}", "",
             f"`horovodrun -np {hvd.size()} python benchmarks/convergence.py --density {args.density} "
             f"--epochs {args.epochs}` ({platform.machine()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d')}). Digits (scikit-learn), 85,002-parameter MLP, batch 16 "
             "per rank, SGD momentum 0.9 (in the compressor for dgc and gssgd: momentum "
             "correction), lr 0.05 with cosine decay. Accuracy: mean of the last "
             "5 epochs. Density error, build-up, imbalance: mean after step 5 (max for the error).",
             "", "| method | accuracy | vs dense | density | density error mean / max | build-up | "
             "imbalance | bytes/step | step ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        final = np.mean(r["accuracies"][-5:])
        lines.append(f"| {r['method']} | {100 * final:.2f} % | "
                     f"{100 * (final - np.mean(dense['accuracies'][-5:])):+.2f} | {r['density']:.5f} | "
                     f"{100 * r['density_error_mean']:.2f} % / {100 * r['density_error_max']:.2f} % | "
                     f"{r['buildup_mean']:.3f} | {r['imbalance_mean']:.2f} | "
                     f"{r['bytes_per_step']:,.0f} | {r['step_ms']:.1f} |")
    lines += ["", f"![convergence](convergence_{args.density}.png)", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--methods", default="none,topk,micro,exdyna,deft,gtopk,randomk,threshold,"
                        "dgc,cltk,gssgd", help="comma-separated; none = dense allreduce")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs = 2
    hvd.init()
    results = [train(m, args.density, epochs=args.epochs, verbose=False)
               for m in args.methods.split(",")]
    if hvd.rank() == 0:
        for r in results:
            print(f"{r['method']:>8}: accuracy {r['accuracy']:.4f}, density {r['density']:.5f}, "
                  f"error {r['density_error_mean']:.4f}/{r['density_error_max']:.4f}, "
                  f"bytes/step {r['bytes_per_step']:,.0f}, step {r['step_ms']:.1f} ms", flush=True)
        if not args.quick:
            write(results, args)


if __name__ == "__main__":
    main()
