"""Threshold control on a real training run: the papers' rule vs our adaptive ladder.

    horovodrun -np 4 python benchmarks/threshold_control.py

Trains the digits MLP with MiCRO and ExDyna under both controls at density
0.01 and writes ``docs/threshold_control.md`` and ``.png`` (density error
per step).  ``--quick``: one epoch, nothing written.
"""

import argparse
import os
import sys

import numpy as np
import horovod.torch as hvd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from digits import train  # noqa: E402

RUNS = [("micro", "paper"), ("micro", "adaptive"), ("exdyna", "paper"), ("exdyna", "adaptive")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.epochs = 1
    hvd.init()
    rows = []
    for method, control in RUNS:
        result = train(method, args.density, epochs=args.epochs, verbose=False,
                       threshold_control=control)
        errors = np.abs(np.array(result["density_per_step"]) / args.density - 1)
        rows.append((method, control, errors, result["accuracy"]))
        if hvd.rank() == 0:
            late = errors[5:] if len(errors) > 5 else errors
            print(f"{method:>7} {control:>9}: density error after step 5 mean {late.mean():.4f} "
                  f"max {late.max():.4f}; accuracy {result['accuracy']:.4f}", flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(rows, args)


def write(rows, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for method, control, errors, _ in rows:
        axis.plot(np.maximum(errors, 1e-4), label=f"{method} / {control}", linewidth=0.8)
    axis.set(yscale="log", xlabel="step", ylabel="|nnz / k - 1|",
             title=f"digits MLP, {hvd.size()} ranks, density {args.density}")
    axis.axhline(0.05, color="gray", linestyle=":")
    axis.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(ROOT, "docs", "threshold_control.png"), dpi=100)
    lines = ["# Threshold control on a real run", "",
             f"`horovodrun -np {hvd.size()} python benchmarks/threshold_control.py` "
             f"(digits MLP, {args.epochs} epochs, density {args.density}). Density error "
             "`|nnz/k - 1|` after step 5.", "",
             "| method | control | mean | max | accuracy |", "|---|---|---:|---:|---:|"]
    for method, control, errors, accuracy in rows:
        lines.append(f"| {method} | {control} | {100 * errors[5:].mean():.2f} % | "
                     f"{100 * errors[5:].max():.2f} % | {100 * accuracy:.2f} % |")
    lines += ["", "![threshold control](threshold_control.png)", ""]
    with open(os.path.join(ROOT, "docs", "threshold_control.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
