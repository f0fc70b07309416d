"""Convergence of every method on the bundled digits data, against dense, on one job.

    horovodrun -np 4 python benchmarks/convergence.py --density 0.01
    horovodrun -np 4 python benchmarks/convergence.py --framework tensorflow

Rank 0 writes ``docs/convergence_<density>.csv`` (test accuracy per epoch),
``docs/convergence_<density>.png`` and ``docs/convergence_<density>.md``
(final accuracy, density, density error, build-up, imbalance, bytes per
step, step time); with ``--framework tensorflow`` (``examples/digits_keras.py``:
Keras ``fit``, dense and ExDyna by default) the files are
``docs/convergence_keras_<density>.*``.  ``--quick`` trains two epochs and
writes nothing.
"""

import argparse
import csv
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

DOCS = os.path.join(ROOT, "docs")


def trainer(framework):
    """``(horovod module, train(method, density, epochs, verbose) -> summary)``."""
    if framework == "tensorflow":
        from digits_keras import hvd, train as fit
        return hvd, lambda *args, **kwargs: fit(*args, **kwargs)[0]
    import horovod.torch as hvd
    from digits import train
    return hvd, train


def write(results, args, size):
    from digits_common import GOSSIP
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = f"convergence_{'keras_' if args.framework == 'tensorflow' else ''}{args.density}"
    stem = os.path.join(DOCS, name)
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch"] + [r["method"] for r in results])
        for epoch in range(args.epochs):
            writer.writerow([epoch + 1] + [f"{r['accuracies'][epoch]:.4f}" for r in results])
    figure, axis = plt.subplots(figsize=(7, 4))
    for r in results:
        axis.plot(range(1, args.epochs + 1), r["accuracies"], label=r["method"])
    axis.set(xlabel="epoch", ylabel="test accuracy", ylim=(0.8, 1.0),
             title=f"digits MLP ({args.framework}), {size} ranks, density {args.density}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(stem + ".png", dpi=100)
    dense = results[0]
    how = ("PyTorch, Horovod's DistributedOptimizer" if args.framework == "torch" else
           "TensorFlow Keras 2 `fit`, Horovod's Keras DistributedOptimizer with groups=1")
    lines = [f"# Convergence at density {args.density} ({args.framework})", "",
             f"`horovodrun -np {size} python benchmarks/convergence.py --framework {args.framework} "
             f"--density {args.density} --epochs {args.epochs} --methods {args.methods}` "
             f"({platform.machine()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d')}). {how}. Digits (scikit-learn), 85,002-parameter MLP, batch 16 "
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
    if any(r["method"] in GOSSIP for r in results):
        lines += ["", "crossover (Crossover-SGD) and sgp (SGP) are gossip optimizers, not "
                  "sparsifiers: each rank averages its whole model with its peers (density 1 by "
                  "construction; accuracy of rank 0's model). See gossip.md."]
    lines += ["", f"![convergence]({name}.png)", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--methods", help="comma-separated; none = dense allreduce (default: "
                        "every method and the gossip optimizers crossover and sgp with torch, "
                        "none,exdyna with tensorflow)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs = 2
    if args.methods is None:
        args.methods = ("none,exdyna" if args.framework == "tensorflow" else
                        "none,topk,micro,exdyna,deft,gtopk,randomk,threshold,dgc,cltk,gssgd,crossover,sgp")
    hvd, train = trainer(args.framework)
    hvd.init()
    results = [train(m, args.density, epochs=args.epochs, verbose=False)
               for m in args.methods.split(",")]
    if hvd.rank() == 0:
        for r in results:
            print(f"{r['method']:>8}: accuracy {r['accuracy']:.4f}, density {r['density']:.5f}, "
                  f"error {r['density_error_mean']:.4f}/{r['density_error_max']:.4f}, "
                  f"bytes/step {r['bytes_per_step']:,.0f}, step {r['step_ms']:.1f} ms", flush=True)
        if not args.quick:
            write(results, args, hvd.size())


if __name__ == "__main__":
    main()
