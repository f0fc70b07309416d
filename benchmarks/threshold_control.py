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

from report import DOCS, Table, error_summary, figure, percent, provenance, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
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
        rows.append({"method": method, "control": control, "errors": errors,
                     "accuracy": result["accuracy"], **error_summary(errors)})
        if hvd.rank() == 0:
            print(f"{method:>7} {control:>9}: density error after step 5 mean "
                  f"{rows[-1]['error_mean']:.4f} max {rows[-1]['error_max']:.4f}; accuracy "
                  f"{result['accuracy']:.4f}", flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(rows, args)


def write(rows, args):
    with figure("threshold_control.png", figsize=(7, 4)) as axis:
        for r in rows:
            axis.plot(np.maximum(r["errors"], 1e-4), label=f"{r['method']} / {r['control']}",
                      linewidth=0.8)
        axis.set(yscale="log", xlabel="step", ylabel="|nnz / k - 1|",
                 title=f"digits MLP, {hvd.size()} ranks, density {args.density}")
        axis.axhline(0.05, color="gray", linestyle=":")
        axis.legend()
    lines = ["# Threshold control on a real run", "",
             provenance(f"horovodrun -np {hvd.size()} python benchmarks/threshold_control.py",
                        "digits MLP", f"{args.epochs} epochs", f"density {args.density}")
             + ". Density error `|nnz/k - 1|` after step 5.", "",
             *Table(("method", "method", ""), ("control", "control", ""),
                    ("mean", percent("error_mean"), ">"),
                    ("max", percent("error_max"), ">"),
                    ("accuracy", percent("accuracy"), ">")).markdown(rows),
             "", "![threshold control](threshold_control.png)", ""]
    write_page("threshold_control.md", lines)


if __name__ == "__main__":
    main()
