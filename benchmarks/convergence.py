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
import os
import platform
import sys

import numpy as np

from common import DENSE, row_options, rows
from report import DOCS, Table, figure, percent, provenance, write_csv, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))


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


# The columns every convergence page shares: density, its error, build-up, imbalance,
# bytes and time per step.
TRAFFIC = (("density", "density", ".5f"),
           ("density error mean / max", lambda r: f"{100 * r['density_error_mean']:.2f} % / "
            f"{100 * r['density_error_max']:.2f} %", ">"),
           ("build-up", "buildup_mean", ".3f"), ("imbalance", "imbalance_mean", ".2f"),
           ("bytes/step", "bytes_per_step", ",.0f"), ("step ms", "step_ms", ".1f"))


def plot(name, results, x, y, labels, title, ylim=None):
    """``docs/name``: ``y`` against ``x`` for each result, dense in bold black."""
    with figure(name, figsize=(7, 4)) as axis:
        for r in results:
            axis.plot(x(r), y(r), label=r["method"],
                      **({"color": "black", "linewidth": 2} if r["method"] == DENSE else {}))
        axis.set(xlabel=labels[0], ylabel=labels[1], title=title, ylim=ylim)
        axis.legend(ncol=2, fontsize="small")


def write_digits(results, args, size):
    from digits_common import GOSSIP

    name = args.page or f"convergence_{'keras_' if args.framework == 'tensorflow' else ''}{args.density}"
    epochs = range(1, args.epochs + 1)
    write_csv(f"{name}.csv", ["epoch"] + [r["method"] for r in results],
              ([x] + [f"{r['accuracies'][i]:.4f}" for r in results] for i, x in enumerate(epochs)))
    plot(f"{name}.png", results, lambda r: epochs, lambda r: r["accuracies"],
         ("epoch", "test accuracy"),
         f"digits MLP ({args.framework}), {size} ranks, density {args.density}", ylim=(0.8, 1.0))
    dense = np.mean(results[0]["accuracies"][-5:])
    for r in results:
        r["final"] = np.mean(r["accuracies"][-5:])
    how = ("PyTorch, Horovod's DistributedOptimizer" if args.framework == "torch" else
           "TensorFlow Keras 2 `fit`, Horovod's Keras DistributedOptimizer with groups=1")
    lines = [f"# Convergence at density {args.density} ({args.framework})", "",
             provenance(f"horovodrun -np {size} python benchmarks/convergence.py --framework "
                        f"{args.framework} --density {args.density} --epochs {args.epochs} "
                        f"--methods {args.methods}{f' --page {args.page}' if args.page else ''}")
             + f". {how}. Digits (scikit-learn), {results[0]['parameters']:,}-parameter MLP, "
             "batch 16 per rank, SGD momentum 0.9 (in the compressor for dgc and gssgd: momentum "
             "correction), lr 0.05 with cosine decay. Accuracy: mean of the last "
             "5 epochs. Density error, build-up, imbalance: mean after step 5 (max for the error).",
             "", *Table(("method", "method", ""),
                        ("accuracy", percent("final"), ">"),
                        ("vs dense", lambda r: 100 * (r["final"] - dense), "+.2f"),
                        *TRAFFIC).markdown(results)]
    if any(r["method"] in GOSSIP for r in results):
        lines += ["", "crossover (Crossover-SGD) and sgp (SGP) are gossip optimizers, not "
                  "sparsifiers: each rank averages its whole model with its peers (density 1 by "
                  "construction; accuracy of rank 0's model). See gossip.md."]
    write_page(f"{name}.md", lines + ["", f"![convergence]({name}.png)", ""])


# The partition family's targets on the language model: validation bits per
# character within this fraction of dense's, per density.
CHARLM_TARGETS = {0.01: 0.02, 0.001: 0.05}
PARTITION_FAMILY = ("micro", "exdyna", "deft")


def write_charlm(results, args, size):
    name = args.page or f"charlm_{args.density}"
    steps = [point["step"] for point in results[0]["curve"]]
    write_csv(f"{name}.csv", ["step"] + [r["method"] for r in results],
              ([x] + [f"{r['curve'][i]['bpc']:.4f}" for r in results] for i, x in enumerate(steps)))
    plot(f"{name}.png", results, lambda r: steps, lambda r: [p["bpc"] for p in r["curve"]],
         ("step", "validation bits per character"),
         f"char-LSTM ({results[0]['parameters'] / 1e6:.2f}M), {size} ranks, density "
         f"{args.density}", ylim=(1.5, 4.5))
    dense = results[0]["bpc"]
    target = CHARLM_TARGETS.get(args.density)
    lines = [f"# Language model at density {args.density}", "",
             provenance(f"horovodrun -np {size} python benchmarks/convergence.py --task charlm "
                        f"--density {args.density} --steps {args.steps} --methods {args.methods}"
                        f"{f' --page {args.page}' if args.page else ''}",
                        f"Python {platform.python_version()}")
             + ". `examples/charlm.py`: a character-level LSTM (embedding 64, LSTM 512, "
             f"{results[0]['parameters']:,} parameters) on the "
             "standard library's sources (16 modules to train on, 3 others to validate on), "
             "windows of 64 characters, batch 16 per rank, SGD momentum 0.9 (in the compressor "
             "for dgc and gssgd), lr 3.0 with cosine decay, the averaged gradient clipped to "
             "norm 1 (Horovod's synchronize / clip / skip_synchronize). Validation bits per "
             "character: mean of the last two evaluations (every 50 steps, 8,192 characters). "
             "Density error, build-up, imbalance: mean after step 5 (max for the error).", "",
             *Table(("method", "method", ""), ("validation bits/char", "bpc", ".3f"),
                    ("vs dense", lambda r: f"{100 * (r['bpc'] / dense - 1):+.1f} %", ">"),
                    *TRAFFIC).markdown(results)]
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
    write_page(f"{name}.md", lines + ["", f"![language model]({name}.png)", ""])


def momentum_note(results, dense):
    """Where the gap comes from, as far as this table shows it: momentum inside the
    compressor (momentum correction) or in the optimizer."""
    def gaps(rows):
        return ", ".join(f"{r['method']} {100 * (r['bpc'] / dense - 1):+.1f} %" for r in rows)
    inside = [r for r in results if r.get("owns_momentum")]
    randomk = [r for r in results if r["method"] == "randomk"]
    outside = [r for r in results if r["method"] not in (DENSE, "randomk")
               and not r.get("owns_momentum")]
    if not inside or not outside:
        return ""
    return ("Against dense, the methods that keep momentum inside the compressor (momentum "
            f"correction; the optimizer runs plain SGD) reach {gaps(inside)}; those that leave "
            f"momentum to the optimizer reach {gaps(outside)}. Under error feedback the "
            "optimizer's momentum is applied to a sparse, delayed update: a coordinate that "
            "waits in the residual for many steps arrives as one large step and is then "
            "carried on by the momentum buffer, while the coordinates that are not sent get "
            "no momentum at all. Lin et al. (DGC, ICLR 2018) introduced momentum correction "
            "for exactly this; the partition family's papers train without it."
            + (f" Left out of both lists: {gaps(randomk)}." if randomk else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("digits", "charlm"), default="digits")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=40, help="digits")
    parser.add_argument("--steps", type=int, default=600, help="charlm")
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--methods", help="comma-separated; dense (or none) = Horovod's "
                        "allreduce (default: every method, and with digits on torch the gossip "
                        "optimizers crossover and sgp; dense,exdyna with tensorflow)")
    parser.add_argument("--page", help="write docs/PAGE.* instead of the default page")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.task == "charlm" and args.framework != "torch":
        parser.error("--task charlm is a PyTorch example")
    if args.quick:
        args.epochs, args.steps = 2, 20
    if args.methods is None:
        args.methods = ("dense,exdyna" if args.framework == "tensorflow" else
                        "dense,topk,micro,exdyna,deft,gtopk,randomk,threshold,dgc,cltk,gssgd"
                        + (",crossover,sgp" if args.task == "digits" else ""))
    hvd, train = trainer(args)
    hvd.init()
    results = [train(m) for m in rows(args.methods)]
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
