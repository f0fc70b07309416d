"""``fallback="auto"`` on the digits MLP, where sparse steps are slower than dense ones.

    horovodrun -np 4 python benchmarks/fallback.py [--methods exdyna,topk,dgc] [--epochs 20]

Trains dense (Horovod's allreduce) and, for each method, the method as it is
and with ``fallback="auto"``, on the same ranks and seeds; prints and writes
``docs/fallback.md``: samples/s, each relative to dense, accuracy, and the
share of steps the fallback sent densely.  The target: no method with the
fallback more than 5 % slower than dense.  (Where sparse wins -- the wide
model across a 1 Gbit/s link -- ``benchmarks/multihost.py --fallback`` shows
how much of the speed-up the fallback keeps.)

    horovodrun -np 4 python benchmarks/fallback.py --steady 600

measures the steady state instead (:func:`steady`): the fallback's step against
dense's, a step of each in turn, and writes ``docs/fallback_steady.md``.
"""

import argparse
import os
import sys

import horovod.torch as hvd
import numpy as np

import horovod_sparse
from horovod_sparse.core.fallback import AutoFallback
from common import DENSE, row_options
from report import DOCS, Table, provenance, write_page

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
from digits import Training  # noqa: E402


def training(method, args, fallback=None):
    """A training run of a row (dense: Horovod's allreduce), not yet started."""
    name, options = row_options(method)
    if method != DENSE:
        options["fallback"] = fallback
    return Training(name, args.density, epochs=args.epochs, verbose=False, **options)


def take_turns(runs, args):
    """Train ``runs`` side by side, an epoch each in turn; their summaries.  (Not a
    step each: the fallback times its steps from one start to the next, which
    would then hold the other run's step.)"""
    for _ in range(args.epochs):
        for run in runs:
            run.epoch()
    return [run.summary() for run in runs]


def compare(method, args):
    """The rows of ``method``: dense, the method as it is, the method with
    ``fallback="auto"``.  In each of ``args.repeats`` rounds dense and the
    fallback train side by side, an epoch each in turn, and the fallback is
    compared with its round's dense run: the machine's speed drifts within
    seconds, and on a ~2-5 ms step runs trained one after the other settled
    up to 1.5x apart.  The round of median samples/s ratio is shown, with every
    round's ratio.  The method as it is trains once, before the first round,
    against that round's dense run."""
    plain, = take_turns([training(method, args)], args)
    rounds = []
    for _ in range(args.repeats):
        dense, auto = take_turns([training(DENSE, args), training(method, args, "auto")], args)
        dense.update(method=DENSE, fallback=None, dense=dense, dense_step_share=1.0)
        auto.update(method=method, fallback="auto", dense=dense)
        rounds.append((auto["samples_per_second"] / dense["samples_per_second"], dense, auto))
    plain.update(method=method, fallback=None, dense=rounds[0][1])
    _, dense, auto = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    auto["round_ratios"] = [r[0] for r in rounds]
    auto["median_step_ratio"] = float(np.median([r[2]["step_ms_median"] / r[1]["step_ms_median"]
                                                 for r in rounds]))
    return [dense, plain, auto]


def batches(run):
    """The shard's batches of ``run``, a fresh shuffle each epoch, endlessly."""
    while True:
        yield from run.epoch_batches()


def steady(method, args):
    """The fallback's steady state: after its first check (an epoch trained alone),
    dense, dense again and the method with ``fallback="auto"`` take ``args.steady``
    steps each, a step of each in turn (the order rotating), and each keeps its
    median step.  Steps in turn cancel the machine's drift, which epochs in turn
    only average; dense against dense again is the measurement's own error.  A
    later check inside the window probes as in training (the probe's periods then
    hold the other runs' steps, which can only delay a switch).  The dense-step share
    counts the window's last 1,000 steps at most (the compressor's history)."""
    runs = [training(DENSE, args), training(DENSE, args), training(method, args, "auto")]
    runs[2].epoch()
    runs[2].model.train()  # as the dense runs, which have not evaluated
    steppers = [(run, batches(run)) for run in runs]
    times = [[] for _ in runs]
    for step in range(args.steady):
        for turn in range(len(runs)):
            index = (step + turn) % len(runs)
            run, stream = steppers[index]
            times[index].append(run.step(next(stream)))
    window = runs[2].compressor.history[-args.steady:]
    dense, again, auto = (1000 * float(np.median(t)) for t in times)
    return {"method": method, "dense_ms": dense, "again_ms": again, "auto_ms": auto,
            "dense_step_share": float(np.mean([m.extra.get("fallback", False) for m in window]))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(horovod_sparse.available()))
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds of dense and the fallback, the median round kept")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--page", default=None,
                        help="the page under docs/ to write (default fallback.md; with --steady, "
                             "fallback_steady.md)")
    parser.add_argument("--steady", type=int, default=0, metavar="STEPS",
                        help="measure the steady state instead: STEPS steps of dense, dense "
                             "again and the fallback in turn, after its first check")
    args = parser.parse_args()
    args.page = args.page or ("fallback_steady.md" if args.steady else "fallback.md")
    hvd.init()
    if args.steady:
        rows = [steady(method, args) for method in args.methods.split(",")]
        if hvd.rank() == 0:
            print(STEADY.header(), *map(STEADY.line, rows), sep="\n", flush=True)
            if not args.no_docs:
                write_steady(rows, args)
        return
    rows = []
    for method in args.methods.split(","):
        method_rows = compare(method, args)
        rows += method_rows
        if hvd.rank() == 0:
            dense = method_rows[0]
            for r in method_rows[1:]:
                print(f"{method:>7} fallback={r['fallback']!s:>4}: {r['samples_per_second']:7.0f} "
                      f"samples/s ({r['samples_per_second'] / r['dense']['samples_per_second']:.2f}x"
                      f" dense), accuracy {r['accuracy']:.4f}, dense steps "
                      f"{r['dense_step_share']:.0%}"
                      + (f"; rounds {', '.join(f'{x:.2f}' for x in r['round_ratios'])}"
                         if "round_ratios" in r else ""), flush=True)
    if hvd.rank() == 0 and not args.no_docs:
        write(rows, args)


def write(rows, args):
    def versus(key):
        return lambda r: r[key] / r["dense"][key]
    plain = [r for r in rows if r["method"] != DENSE and r["fallback"] is None]
    slower = sum(versus("samples_per_second")(r) < 1 for r in plain)
    autos = [r for r in rows if r["fallback"] == "auto"]
    worst = min(map(versus("samples_per_second"), autos))
    worst_median = max(r["median_step_ratio"] for r in autos)
    worst_run = min(r["dense"]["train_seconds"] / r["train_seconds"] for r in autos)
    schedule = AutoFallback()
    lines = [
        "# fallback=\"auto\" on the digits MLP", "",
        "Generated by " + provenance(
            f"horovodrun -np {hvd.size()} python benchmarks/fallback.py"
            + ("" if args.page == "fallback.md" else f" --page {args.page}")
            + ("" if args.repeats == 5 else f" --repeats {args.repeats}"),
            f"{hvd.size()} ranks on one host", f"density {args.density}", f"{args.epochs} epochs")
        + f".  In each of {args.repeats} round{'s' if args.repeats > 1 else ''} dense and "
        "the method with the fallback train side by side, an epoch each in turn, and each "
        "fallback run is compared with its round's dense run: the machine's speed drifts "
        "within seconds, and runs trained one after the other settled up to 1.5x apart.  The "
        "round of median samples/s ratio is shown, with every round's ratio; the method "
        "without the fallback trains once, against the first round's dense run.  Samples/s "
        "count the epochs after the first (every row alike); *whole run* counts every step, "
        "the first epoch's warm-up and first check included.  Methods that step slower than "
        "a dense allreduce "
        f"of {rows[0]['parameters']:,} parameters here without the fallback: {slower} of "
        f"{len(plain)}; with `fallback=\"auto\"` the compressor "
        "times both kinds of step and sends densely where that is faster "
        "(`horovod_sparse/core/fallback.py`).", "",
        *Table(("method", "method", ""), ("fallback", lambda r: r["fallback"] or "-", ""),
               ("samples/s", "samples_per_second", ".0f"),
               ("vs dense", versus("samples_per_second"), ".2f"),
               ("median step ms", "step_ms_median", ".1f"),
               ("vs dense", versus("step_ms_median"), ".2f"),
               ("whole run vs dense", lambda r: r["dense"]["train_seconds"] / r["train_seconds"],
                ".2f"),
               ("rounds (samples/s vs dense)", lambda r: ", ".join(
                   f"{x:.2f}" for x in r.get("round_ratios", ())) or "-", ""),
               ("accuracy", "accuracy", ".4f"),
               ("dense steps", "dense_step_share", ".0%")).markdown(rows),
        "", f"Target: with the fallback no method below 0.95 of dense's samples/s; "
        f"slowest here (median round): {worst:.2f} ({'met' if worst >= 0.95 else 'missed'}); "
        f"by the median step time (median over the rounds), the slowest is {worst_median:.2f}x "
        f"dense's ({'met' if worst_median <= 1 / 0.95 else 'missed'}); over the whole run, "
        f"first epoch included, the slowest runs at {worst_run:.2f} of dense's speed.", "",
        "A dense step of the fallback is Horovod's own allreduce of each gradient, "
        "overlapped with the backward pass like dense's: the first one after sparse "
        "steps adds the residual to each gradient, later ones hand Horovod the "
        "gradients as they are (DGC and gs-SGD from the third: the second makes the "
        "ranks' mean velocity every rank's, and the momentum is then applied to each "
        "averaged gradient).  What remains between the two is the probe (after "
        f"{schedule.warmup} warm-up steps, {schedule.block} sparse and {schedule.block} dense "
        "steps per check, the first of each kind untimed; checks at least "
        f"{schedule.recheck_every} steps apart and further where one kind clearly loses, a "
        "change of choice after the first confirmed by a second check) and "
        "the compressor's bookkeeping per gradient.", ""]
    if hvd.size() > (os.cpu_count() or 1):
        lines += [f"{hvd.size()} ranks share {os.cpu_count()} cores here: a rank waiting in a "
                  "collective is often descheduled, samples/s (from the mean step time) carry "
                  "the scheduler's outliers, and the median step time is the steadier column.",
                  ""]
    write_page(args.page, lines)


STEADY = Table(("method", "method", ""), ("dense ms", "dense_ms", ".3f"),
               ("dense again ms", "again_ms", ".3f"), ("fallback ms", "auto_ms", ".3f"),
               ("fallback vs dense", lambda r: r["auto_ms"] / r["dense_ms"], ".3f"),
               ("dense again vs dense", lambda r: r["again_ms"] / r["dense_ms"], ".3f"),
               ("dense steps", "dense_step_share", ".1%"))


def write_steady(rows, args):
    worst = max(r["auto_ms"] / r["dense_ms"] for r in rows)
    error = max(abs(r["again_ms"] / r["dense_ms"] - 1) for r in rows)
    write_page(args.page, [
        "# fallback=\"auto\" in its steady state on the digits MLP", "",
        "Generated by " + provenance(
            f"horovodrun -np {hvd.size()} python benchmarks/fallback.py --steady {args.steady}"
            + ("" if args.page == "fallback_steady.md" else f" --page {args.page}"),
            f"{hvd.size()} ranks on one host", f"density {args.density}")
        + ".  For each method the fallback first trains an epoch alone (its first check "
        f"decides); then dense, dense again and the fallback take {args.steady} steps each, a "
        "step of each in turn, and the median step of each is shown.  Steps in turn cancel the "
        "machine's drift, which the epochs in turn of `fallback.md` only average; *dense "
        "again vs dense* is the measurement's own error.  *Dense steps*: the fallback's share "
        "in the window (a check inside it probes sparse steps, as in training).", "",
        *STEADY.markdown(rows), "",
        f"Target: the fallback's step within 5 % of dense's: the slowest is {worst:.3f}x "
        f"({'met' if worst <= 1 / 0.95 else 'missed'}); dense against dense again differs by up to "
        f"{error:.1%}.", ""])


if __name__ == "__main__":
    main()
