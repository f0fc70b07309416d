"""What sending small tensors densely changes: ``dense_1d`` on the digits MLP.

    horovodrun -np 2 python benchmarks/dense_below.py

Trains the digits MLP of ``examples/digits.py`` with each method at each
density, once with every gradient sparsified (the default) and once with
``dense_1d=True`` (its three bias vectors, 522 of 85,002 elements, averaged
exactly by one more allreduce a step).  Rank 0 writes ``docs/dense_below.md``:
accuracy, step time, bytes per step, the density of the sparsified part and
the overall density.  ``--quick``: one method, two epochs, nothing written.
"""

import argparse
import os
import sys

import numpy as np
import horovod.torch as hvd

from report import DOCS, Table, percent, provenance, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
from digits import make_model, train  # noqa: E402

SPARSIFIED = "every gradient sparsified"
SETTINGS = {SPARSIFIED: {}, "dense_1d=True": {"dense_1d": True}}


def final_accuracy(run):
    return float(np.mean(run["accuracies"][-5:]))


def write(runs, args):
    parameters = list(make_model().parameters())
    rows = []
    for (method, density, setting), run in runs.items():
        base = runs[(method, density, SPARSIFIED)]
        rows.append({**run, "method": method, "density_target": density, "setting": setting,
                     "final": final_accuracy(run),
                     "gain": final_accuracy(run) - final_accuracy(base),
                     "slower": run["step_ms"] / base["step_ms"]})
    gains, slower = zip(*((r["gain"], r["slower"]) for r in rows if r["setting"] != SPARSIFIED))
    lines = ["# Small tensors dense", "",
             provenance(f"horovodrun -np {hvd.size()} python benchmarks/dense_below.py --epochs "
                        f"{args.epochs} --methods {args.methods} --densities {args.densities}")
             + f". Digits MLP ({sum(p.numel() for p in parameters):,} parameters; its "
             f"{sum(p.dim() == 1 for p in parameters)} bias vectors hold "
             f"{sum(p.numel() for p in parameters if p.dim() == 1):,}), "
             "batch 16 per rank, the schedule of `examples/digits.py`. Accuracy: mean of the "
             "last 5 epochs. *density*: of the sparsified part (the method's target); "
             "*overall*: every element, the dense ones included.", "",
             *Table(("method", "method", ""), ("density", "density_target", ">"),
                    ("setting", "setting", ""),
                    ("accuracy", percent("final"), ">"),
                    ("vs sparsified", lambda r: 100 * r["gain"], "+.2f"),
                    ("step ms", "step_ms", ".1f"), ("bytes/step", "bytes_per_step", ",.0f"),
                    ("density", "density", ".5f"),
                    ("overall", "overall_density", ".5f")).markdown(rows),
             "", f"Over these runs `dense_1d` changed accuracy by {100 * min(gains):+.2f} to "
             f"{100 * max(gains):+.2f} points and step time by {min(slower):.2f}x to "
             f"{max(slower):.2f}x. The default stays off (every gradient sparsified), which "
             "keeps each method as its paper states it; turn it on where the small tensors "
             "matter (the accuracy column says how much they did here).", ""]
    write_page("dense_below.md", lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="exdyna,topk,dgc")
    parser.add_argument("--densities", default="0.01,0.001")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.methods, args.densities, args.epochs = "exdyna", "0.01", 2
    hvd.init()
    runs = {}
    for method in args.methods.split(","):
        for density in map(float, args.densities.split(",")):
            for setting, options in SETTINGS.items():
                run = train(method, density, epochs=args.epochs, verbose=False, **options)
                runs[(method, density, setting)] = run
                if hvd.rank() == 0:
                    print(f"{method:>7} {density:<6} {setting:>26}: accuracy "
                          f"{final_accuracy(run):.4f}, {run['step_ms']:.1f} ms/step, "
                          f"{run['bytes_per_step']:,.0f} B/step, overall density "
                          f"{run['overall_density']:.5f}", flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(runs, args)


if __name__ == "__main__":
    main()
