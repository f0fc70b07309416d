"""Convergence of every method against dense on a real task, on one job.

    horovodrun -np 4 python benchmarks/convergence.py --density 0.01
    horovodrun -np 4 python benchmarks/convergence.py --framework tensorflow
    horovodrun -np 2 python benchmarks/convergence.py --task charlm --density 0.01

Rank 0 writes ``docs/convergence_<density>.csv`` (test accuracy per epoch),
``docs/convergence_<density>.png`` and ``docs/convergence_<density>.md``
(final accuracy, density, density error, build-up, imbalance, bytes per
step, step time); with ``--framework tensorflow`` (``examples/digits_keras.py``:
Keras ``fit``, dense and ExDyna by default) the files are
``docs/convergence_keras_<density>.*``; ``--page NAME`` writes
``docs/NAME.*`` instead (a comparison that is not the main page).  A method
may be a variant row of ``benchmarks/common.py`` (``topk/union``,
``deft/paper``: the method with its paper-mode setting) or a method with
settings, ``gssgd:columns=1360:rows=7``.  With ``--task charlm`` (the
character-level LSTM of ``examples/charlm.py`` on the standard library's
sources, PyTorch) the files are ``docs/charlm_<density>.*``: validation bits
per character every 50 steps instead of accuracy per epoch.  ``--quick``
trains two epochs (charlm: 20 steps) and writes nothing.
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

from common import row_options  # noqa: E402


def trainer(args):
    """``(horovod module, train(row) -> summary)`` for the task and framework; a
    row is a method, a variant or ``method:key=value`` (``common.row_options``)."""
    if args.framework == "tensorflow":
        from digits_keras import hvd, train as fit

        def train(method, density, **options):
            return fit(method, density, epochs=args.epochs, **options)[0]
    elif args.task == "charlm":
        import horovod.torch as hvd
        from charlm import train as run_steps

        def train(method, density, **options):
            return run_steps(method, density, steps=args.steps, **options)
    else:
        import horovod.torch as hvd
        from digits import train as run_epochs

        def train(method, density, **options):
            return run_epochs(method, density, epochs=args.epochs, **options)

    def train_row(row):
        method, options = row_options(row)
        if options and args.framework == "tensorflow":
            raise SystemExit(f"{row}: variant rows run on PyTorch only")
        return {**train(method, args.density, verbose=False, **options), "method": row}
    return hvd, train_row


def traffic_cells(r):
    """The table cells every convergence page shares: density, its error, build-up,
    imbalance, bytes and time per step."""
    return (f"{r['density']:.5f} | {100 * r['density_error_mean']:.2f} % / "
            f"{100 * r['density_error_max']:.2f} % | {r['buildup_mean']:.3f} | "
            f"{r['imbalance_mean']:.2f} | {r['bytes_per_step']:,.0f} | {r['step_ms']:.1f}")


TRAFFIC_HEADER = ("density | density error mean / max | build-up | imbalance | bytes/step | "
                  "step ms |", "---:|---:|---:|---:|---:|---:|")


def write_series(stem, x_name, xs, results, series):
    """``stem.csv``: one row per ``x``, one column per method's ``series``."""
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([x_name] + [r["method"] for r in results])
        for i, x in enumerate(xs):
            writer.writerow([x] + [f"{series(r)[i]:.4f}" for r in results])


def plot(stem, results, x, y, labels, title, ylim=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for r in results:
        dense = r["method"] == "none"
        axis.plot(x(r), y(r), label="dense" if dense else r["method"],
                  **({"color": "black", "linewidth": 2} if dense else {}))
    axis.set(xlabel=labels[0], ylabel=labels[1], title=title, ylim=ylim)
    axis.legend(ncol=2, fontsize="small")
    figure.tight_layout()
    figure.savefig(stem + ".png", dpi=100)


def write_digits(results, args, size):
    from digits_common import GOSSIP

    name = args.page or f"convergence_{'keras_' if args.framework == 'tensorflow' else ''}{args.density}"
    stem = os.path.join(DOCS, name)
    epochs = range(1, args.epochs + 1)
    write_series(stem, "epoch", epochs, results, lambda r: r["accuracies"])
    plot(stem, results, lambda r: epochs, lambda r: r["accuracies"], ("epoch", "test accuracy"),
         f"digits MLP ({args.framework}), {size} ranks, density {args.density}", ylim=(0.8, 1.0))
    dense = results[0]
    how = ("PyTorch, Horovod's DistributedOptimizer" if args.framework == "torch" else
           "TensorFlow Keras 2 `fit`, Horovod's Keras DistributedOptimizer with groups=1")
    lines = [f"# Convergence at density {args.density} ({args.framework})", "",
             f"`horovodrun -np {size} python benchmarks/convergence.py --framework {args.framework} "
             f"--density {args.density} --epochs {args.epochs} --methods {args.methods}"
             f"{f' --page {args.page}' if args.page else ''}` "
             f"({platform.machine()}, {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d')}). {how}. Digits (scikit-learn), 85,002-parameter MLP, batch 16 "
             "per rank, SGD momentum 0.9 (in the compressor for dgc and gssgd: momentum "
             "correction), lr 0.05 with cosine decay. Accuracy: mean of the last "
             "5 epochs. Density error, build-up, imbalance: mean after step 5 (max for the error).",
             "", "| method | accuracy | vs dense | " + TRAFFIC_HEADER[0],
             "|---|---:|---:|" + TRAFFIC_HEADER[1]]
    for r in results:
        final = np.mean(r["accuracies"][-5:])
        lines.append(f"| {r['method']} | {100 * final:.2f} % | "
                     f"{100 * (final - np.mean(dense['accuracies'][-5:])):+.2f} | "
                     f"{traffic_cells(r)} |")
    if any(r["method"] in GOSSIP for r in results):
        lines += ["", "crossover (Crossover-SGD) and sgp (SGP) are gossip optimizers, not "
                  "sparsifiers: each rank averages its whole model with its peers (density 1 by "
                  "construction; accuracy of rank 0's model). See gossip.md."]
    lines += ["", f"![convergence]({name}.png)", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))


# The partition family's targets on the language model: validation bits per
# character within this fraction of dense's, per density.
CHARLM_TARGETS = {0.01: 0.02, 0.001: 0.05}
PARTITION_FAMILY = ("micro", "exdyna", "deft")


def write_charlm(results, args, size):
    name = args.page or f"charlm_{args.density}"
    stem = os.path.join(DOCS, name)
    steps = [point["step"] for point in results[0]["curve"]]
    write_series(stem, "step", steps, results, lambda r: [p["bpc"] for p in r["curve"]])
    plot(stem, results, lambda r: steps, lambda r: [p["bpc"] for p in r["curve"]],
         ("step", "validation bits per character"),
         f"char-LSTM (1.33M), {size} ranks, density {args.density}", ylim=(1.5, 4.5))
    dense = results[0]["bpc"]
    target = CHARLM_TARGETS.get(args.density)
    lines = [f"# Language model at density {args.density}", "",
             f"`horovodrun -np {size} python benchmarks/convergence.py --task charlm "
             f"--density {args.density} --steps {args.steps} --methods {args.methods}"
             f"{f' --page {args.page}' if args.page else ''}` "
             f"({platform.machine()}, {os.cpu_count()} cores, Python "
             f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}). `examples/charlm.py`: "
             "a character-level LSTM (embedding 64, LSTM 512, 1,331,456 parameters) on the "
             "standard library's sources (16 modules to train on, 3 others to validate on), "
             "windows of 64 characters, batch 16 per rank, SGD momentum 0.9 (in the compressor "
             "for dgc and gssgd), lr 3.0 with cosine decay, the averaged gradient clipped to "
             "norm 1 (Horovod's synchronize / clip / skip_synchronize). Validation bits per "
             "character: mean of the last two evaluations (every 50 steps, 8,192 characters). "
             "Density error, build-up, imbalance: mean after step 5 (max for the error).", "",
             "| method | validation bits/char | vs dense | " + TRAFFIC_HEADER[0],
             "|---|---:|---:|" + TRAFFIC_HEADER[1]]
    for r in results:
        lines.append(f"| {'dense' if r['method'] == 'none' else r['method']} | {r['bpc']:.3f} | "
                     f"{100 * (r['bpc'] / dense - 1):+.1f} % | {traffic_cells(r)} |")
    if target is not None:
        lines += ["", f"Target: MiCRO, ExDyna and DEFT within {100 * target:.0f} % of dense's "
                  "bits per character after the same number of steps."]
        for r in results:
            if r["method"] in PARTITION_FAMILY:
                gap = r["bpc"] / dense - 1
                lines.append(f"* {r['method']}: {100 * gap:+.1f} % "
                             + ("(met)" if gap <= target else
                                f"(missed by {100 * (gap - target):.1f} points)"))
        lines += ["", momentum_note(results, dense)]
    lines += ["", f"![language model]({name}.png)", ""]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines))


def momentum_note(results, dense):
    """Where the gap comes from, as far as this table shows it: momentum inside the
    compressor (momentum correction) or in the optimizer."""
    def gaps(rows):
        return ", ".join(f"{r['method']} {100 * (r['bpc'] / dense - 1):+.1f} %" for r in rows)
    inside = [r for r in results if r.get("owns_momentum")]
    outside = [r for r in results if r["method"] != "none" and not r.get("owns_momentum")
               and r["method"] != "randomk"]
    if not inside or not outside:
        return ""
    return ("Against dense, the methods that keep momentum inside the compressor (momentum "
            f"correction; the optimizer runs plain SGD) reach {gaps(inside)}; those that leave "
            f"momentum to the optimizer reach {gaps(outside)}. Under error feedback the "
            "optimizer's momentum is applied to a sparse, delayed update: a coordinate that "
            "waits in the residual for many steps arrives as one large step and is then "
            "carried on by the momentum buffer, while the coordinates that are not sent get "
            "no momentum at all. Lin et al. (DGC, ICLR 2018) introduced momentum correction "
            "for exactly this; the partition family's papers train without it. Random-k "
            "(left out of both lists) does not learn at this learning rate, as on the digits.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("digits", "charlm"), default="digits")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=40, help="digits")
    parser.add_argument("--steps", type=int, default=600, help="charlm")
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--methods", help="comma-separated; none = dense allreduce (default: "
                        "every method, and with digits on torch the gossip optimizers "
                        "crossover and sgp; none,exdyna with tensorflow)")
    parser.add_argument("--page", help="write docs/PAGE.* instead of the default page")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.task == "charlm" and args.framework != "torch":
        parser.error("--task charlm is a PyTorch example")
    if args.quick:
        args.epochs, args.steps = 2, 20
    if args.methods is None:
        args.methods = ("none,exdyna" if args.framework == "tensorflow" else
                        "none,topk,micro,exdyna,deft,gtopk,randomk,threshold,dgc,cltk,gssgd"
                        + (",crossover,sgp" if args.task == "digits" else ""))
    hvd, train = trainer(args)
    hvd.init()
    results = [train(m) for m in args.methods.split(",")]
    if hvd.rank() == 0:
        quality = "bpc" if args.task == "charlm" else "accuracy"
        for r in results:
            print(f"{r['method']:>8}: {quality} {r[quality]:.4f}, density {r['density']:.5f}, "
                  f"error {r['density_error_mean']:.4f}/{r['density_error_max']:.4f}, "
                  f"bytes/step {r['bytes_per_step']:,.0f}, step {r['step_ms']:.1f} ms", flush=True)
        if not args.quick:
            (write_charlm if args.task == "charlm" else write_digits)(results, args, hvd.size())


if __name__ == "__main__":
    main()
