"""Synthetic training benchmark in Horovod's format, dense or through a horovod_sparse compressor.

    horovodrun -np 4 python benchmarks/synthetic.py --model wide --compression exdyna --density 0.001

Like Horovod's ``pytorch_synthetic_benchmark.py``: random data, a fixed
model, Horovod's ``DistributedOptimizer``; prints ``Iter #i: X img/sec per
worker``, ``Img/sec per worker: X +-Y`` and ``Total img/sec on N worker(s):
X +-Y``.  Models: ``wide`` (an MLP 4096-4096-2048-1000 on 4096 features,
27.2M parameters: communication-heavy, little compute per parameter) and
``small`` (an MLP 64-256-256-10, 85k parameters).  Besides throughput it
reports the density and bytes per worker per step, and a per-step time
breakdown, as in the Top-k analysis of Shi et al. (2019): forward+backward;
for a sparse method the wait in ``synchronize()`` before its exchange
starts (Horovod's round of one-element placeholders, which also waits for
the slower rank's backward pass; under ``--fallback auto`` a dense step's
allreduce is Horovod's own and counts here too); selection and communication (the
compressor's own timers; for dense, the wait in ``synchronize()``); and the
rest: the exchange's local work (forming ``acc``, zeroing the output, the
commit) and the optimizer update.
``--compression`` takes a comma-separated list (``dense,topk,exdyna``;
``none`` is dense too): the methods run one after the other in the same
job.  With dense among several rows, dense takes turns with each method,
iteration by iteration, and each method is compared with the dense
iterations that alternated with it.  ``--json`` writes the list of results
(rank 0); ``--docs`` writes
``docs/synthetic.md`` and ``docs/synthetic.png`` (throughput of each method
against dense, the step breakdown, density and bytes); ``--quick`` runs one
short iteration.

Timings need a core per rank: with more ranks on a host than it has cores
the page measures the scheduler, and the script says so.  Every run also
measures its floors on this machine, all ranks at once: one accumulate pass
over the ``n`` parameters (read gradient and residual, write ``acc``) and
one read of ``n/P`` elements (a rank's share), and reports selection as a
multiple of the read and the compressor's extra time outside selection and
communication (its "other" minus dense's) as a multiple of the accumulate
pass.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
import horovod.torch as hvd

import horovod_sparse
import horovod_sparse.torch as hs
from common import (DENSE, FLOORS_NOTE, best_ms, oversubscription_note, relative_to_floors,
                    row_options, rows)
from report import Table, figure, provenance, summarize, write_page
MODELS = {"wide": (4096, [4096, 2048], 1000), "small": (64, [256, 256], 10)}


def make_model(name):
    features, hidden, classes = MODELS[name]
    layers, width = [], features
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes)), features, classes


def measure_floors(n, size):
    """Milliseconds of one accumulate pass over ``n`` float32 elements and one read
    of ``n / size``, timed on every rank at once (the ranks share memory bandwidth)."""
    grad, residual = np.random.default_rng(0).standard_normal((2, n), dtype=np.float32)
    acc = np.empty_like(grad)
    share = grad[:n // size]
    hvd.allreduce(torch.zeros(1), name="floors.start")
    floors = {"accumulate_ms": best_ms(lambda: np.add(grad, residual, out=acc)),
              "read_share_ms": best_ms(share.sum)}
    hvd.allreduce(torch.zeros(1), name="floors.stop")
    return floors


class Trainer:
    """One row's model and Horovod ``DistributedOptimizer`` on fixed random data,
    stepped one iteration (``batches_per_iter`` steps) at a time, so that rows can
    take turns: each step's forward+backward, ``synchronize()`` and update times
    and each iteration's img/sec per worker are kept."""

    def __init__(self, args, method):
        self.args, self.method = args, method
        torch.manual_seed(0)
        self.model, features, classes = make_model(args.model)
        # each row's own Horovod names: rows that take turns never share a tensor name
        named = [(f"{method}.{name}", p) for name, p in self.model.named_parameters()]
        self.compression = hvd.Compression.none
        if method != DENSE:
            name, options = row_options(method)
            self.compression = hs.Compression.create(
                name, density=args.density, named_parameters=named, fallback=args.fallback,
                **options)
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.001), named_parameters=named,
            compression=self.compression)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.data = torch.randn(args.batch_size, features)
        self.target = torch.randint(0, classes, (args.batch_size,))
        self.times = {"forward_backward": [], "synchronize": [], "update": []}
        self.rates, self.loss = [], float("nan")

    def step(self):
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(self.data), self.target)
        loss.backward()
        self.loss = loss.item()
        backward_done = time.perf_counter()
        self.optimizer.synchronize()
        synchronized = time.perf_counter()
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        done = time.perf_counter()
        self.times["forward_backward"].append(backward_done - start)
        self.times["synchronize"].append(synchronized - backward_done)
        self.times["update"].append(done - synchronized)

    def warm_up(self):
        for _ in range(self.args.warmup):
            self.step()
        for values in self.times.values():
            values.clear()

    def iteration(self):
        """One timed iteration; returns its img/sec per worker."""
        start = time.perf_counter()
        for _ in range(self.args.batches_per_iter):
            self.step()
        self.rates.append(self.args.batch_size * self.args.batches_per_iter
                          / (time.perf_counter() - start))
        return self.rates[-1]

    def mark(self):
        """Where the timings stand now, for :func:`report` ``since``."""
        return len(self.rates)


def benchmark(args, methods):
    """Train each row for ``args.iters`` iterations and report it.  With dense among
    several rows, dense takes turns with each method, iteration by iteration, and
    the method is compared with the dense iterations that alternated with it: the
    machine's speed drifts between minutes (here dense's loopback allreduce took
    67-200 ms from one run to the next), so rows timed apart are not comparable.
    The dense row reports all of dense's iterations."""
    if DENSE not in methods or len(methods) == 1:
        return [report(run_alone(Trainer(args, method))) for method in methods]
    dense = Trainer(args, DENSE)
    dense.warm_up()
    results = {}
    for method in methods:
        if method == DENSE:
            continue
        trainer = Trainer(args, method)
        announce(args, method)
        trainer.warm_up()
        since = dense.mark()
        for iteration in range(args.iters):
            rate, dense_rate = trainer.iteration(), dense.iteration()
            if hvd.rank() == 0:
                print(f"Iter #{iteration}: {rate:.1f} img/sec per worker (dense, alternating: "
                      f"{dense_rate:.1f})", flush=True)
        results[method] = report(trainer)
        paired = report(dense, since, verbose=False)
        results[method].update(paired_dense_img_sec=paired["total_img_sec"],
                               paired_dense_other_ms=paired["other_ms"])
        del trainer
    announce(args, DENSE)
    results[DENSE] = report(dense)
    return [results[method] for method in methods]


def run_alone(trainer):
    """Warm ``trainer`` up and time its iterations, with no other row between them."""
    announce(trainer.args, trainer.method)
    trainer.warm_up()
    for iteration in range(trainer.args.iters):
        rate = trainer.iteration()
        if hvd.rank() == 0:
            print(f"Iter #{iteration}: {rate:.1f} img/sec per worker", flush=True)
    return trainer


def announce(args, method):
    if hvd.rank() == 0:
        print(f"Model: {args.model}, compression: {method}"
              + ("" if method == DENSE else f" (density {args.density})"))
        print(f"Batch size: {args.batch_size}\nNumber of workers: {hvd.size()}", flush=True)


def report(trainer, since=0, verbose=True):
    """The result of ``trainer``'s iterations from ``since`` on (printed when ``verbose``)."""
    args, method = trainer.args, trainer.method
    steps = since * args.batches_per_iter
    times = {key: values[steps:] for key, values in trainer.times.items()}
    rates = np.array(trainer.rates[since:])
    n = sum(p.numel() for p in trainer.model.parameters())
    step_ms = {key: 1000 * float(np.mean(value)) for key, value in times.items()}
    if method == DENSE:
        summary = {"selection_ms": 0.0, "communication_ms": step_ms["synchronize"], "density": 1.0,
                   "bytes_per_step": 8.0 * n, "dense_step_share": 1.0}
    else:
        summary = summarize(trainer.compression.history[-len(times["update"]):])
    # a sparse step's synchronize(): Horovod's round of placeholders (waiting for the
    # slower rank's backward pass too), then the exchange (summary["total_ms"])
    wait = 0.0 if method == DENSE else step_ms["synchronize"] - summary["total_ms"]
    breakdown = {"forward_backward_ms": step_ms["forward_backward"], "wait_ms": wait,
                 "selection_ms": summary["selection_ms"],
                 "communication_ms": summary["communication_ms"]}
    breakdown["other_ms"] = sum(step_ms.values()) - sum(breakdown.values())
    breakdown["step_ms"] = sum(step_ms.values())
    size = hvd.size()
    result = {"model": args.model, "parameters": n, "method": method,
              "density_target": args.density if method != DENSE else 1.0,
              "ranks": size, "batch_size": args.batch_size,
              "img_sec_per_worker": float(rates.mean()), "img_sec_per_worker_ci": float(1.96 * rates.std()),
              "total_img_sec": float(size * rates.mean()), "total_img_sec_ci": float(size * 1.96 * rates.std()),
              "loss": trainer.loss, "fallback": args.fallback if method != DENSE else None,
              **summary, **breakdown}
    if verbose and hvd.rank() == 0:
        print(f"Img/sec per worker: {rates.mean():.1f} +-{1.96 * rates.std():.1f}")
        print(f"Total img/sec on {size} worker(s): {size * rates.mean():.1f} "
              f"+-{size * 1.96 * rates.std():.1f}")
        print(f"Model {args.model}: {n:,} parameters; {method}: density {result['density']:.5f}, "
              f"{result['bytes_per_step']:,.0f} bytes/worker/step, loss {trainer.loss:.4f} at the last step")
        print("Step breakdown (ms): " + ", ".join(f"{key[:-3]} {value:.1f}"
                                                 for key, value in breakdown.items()), flush=True)
    return result


def throughput_table(results, *extra):
    """Throughput, its ratio to dense's and the step breakdown of each result, then
    the ``extra`` columns and bytes per step."""
    dense = next((r for r in results if r["method"] == DENSE), results[0])["total_img_sec"]

    def versus_dense(r):
        return f"{r['total_img_sec'] / r.get('paired_dense_img_sec', dense):.2f}x"
    return Table(("method", "method", ""),
                 ("total img/sec",
                  lambda r: f"{r['total_img_sec']:.1f} +-{r['total_img_sec_ci']:.1f}", ">"),
                 ("vs dense", versus_dense, ">"),
                 ("step ms", "step_ms", ".0f"), ("fwd+bwd", "forward_backward_ms", ".0f"),
                 ("wait", "wait_ms", ".0f"), ("selection", "selection_ms", ".0f"),
                 ("communication", "communication_ms", ".0f"),
                 ("other", "other_ms", ".0f"), ("sel/read", "selection_x_read", ".1f"),
                 ("extra/acc", "extra_other_x_accumulate", ".1f"), *extra,
                 ("bytes/worker/step", "bytes_per_step", ",.0f"))


def write_docs(results, args):
    size, n = results[0]["ranks"], results[0]["parameters"]
    shared = ("The ranks share the machine's cores, so forward/backward and every per-element pass "
              "cost several times what they would with a core (or GPU) per rank."
              if size > os.cpu_count() else "One core per rank.")
    lines = ["# Synthetic training throughput on one host", "",
             provenance(f"horovodrun -np {size} python benchmarks/synthetic.py --model {args.model} "
                        f"--density {args.density} --iters {args.iters} --compression "
                        f"{args.compression} --docs", f"{size} ranks on one host",
                        "Gloo over loopback")
             + f". Horovod's `DistributedOptimizer`, "
             f"`{args.model}` model ({n:,} parameters), batch {args.batch_size} per rank, "
             f"{args.iters} iterations of {args.batches_per_iter} batches after {args.warmup} "
             "warm-up steps. Breakdown per step (ms): forward+backward; *wait*: a sparse "
             "step's wait in `synchronize()` before its exchange starts (Horovod's round of "
             "one-element placeholders, which also waits for the slower rank's backward pass); "
             "selection and communication (the compressor's own timers; dense: the wait in "
             "`synchronize()`); other (the exchange's local work -- forming acc, zeroing the "
             f"output, the commit -- and the optimizer update). {shared}", "",
             "Dense takes turns with each method, iteration by iteration, in the same job: "
             "*vs dense* compares the method with the dense iterations that alternated with it "
             "(their img/sec: *dense alongside*), and the dense row shows all of them.  The "
             "machine's speed drifts from minute to minute, so rows timed apart are not "
             "comparable.", "",
             "Floors measured in the same run, all ranks at once: one accumulate pass over n "
             f"(read gradient and residual, write acc) {results[0]['floor_accumulate_ms']:.1f} ms; "
             f"one read of n/P {results[0]['floor_read_share_ms']:.1f} ms. *sel/read*: selection "
             "as a multiple of the read; *extra/acc*: the method's other minus dense's other, as a "
             f"multiple of the accumulate pass. {FLOORS_NOTE}", "",
             *throughput_table(results, ("density", "density", ".5f"), (
                 "dense alongside", lambda r: (f"{r['paired_dense_img_sec']:.1f}"
                                               if "paired_dense_img_sec" in r else "-"), ">"),
             ).markdown(results),
             "", "![throughput](synthetic.png)", ""]
    write_page("synthetic.md", lines)
    with figure("synthetic.png", figsize=(8, 4)) as axis:
        names = [r["method"] for r in results]
        bottom = np.zeros(len(results))
        for key, label in (("forward_backward_ms", "forward+backward"), ("wait_ms", "wait"),
                           ("selection_ms", "selection"), ("communication_ms", "communication"),
                           ("other_ms", "other")):
            values = np.array([r[key] for r in results])
            axis.bar(names, values, bottom=bottom, label=label)
            bottom += values
        top = 2.5 * float(np.median(bottom))
        if bottom.max() > top:  # outliers would flatten the rest: clip them, print their totals
            axis.set_ylim(0, top)
            for x, total in enumerate(bottom):
                if total > top:
                    axis.text(x, 0.97 * top, f"{total:,.0f} ms", ha="center", va="top",
                              fontsize=8, rotation=90, color="white")
        axis.set(ylabel="ms per step", title=f"{args.model} model ({n:,} parameters), {size} "
                 f"ranks, density {args.density}")
        axis.tick_params(axis="x", rotation=45)
        axis.legend()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="wide")
    parser.add_argument("--compression", default="exdyna", help="comma-separated: dense (or "
                        "none: Horovod's allreduce) or horovod_sparse methods: "
                        + ", ".join(horovod_sparse.available()))
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps, not measured")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--batches-per-iter", type=int, default=3)
    parser.add_argument("--fallback", choices=["auto"], help="the compressors' fallback")
    parser.add_argument("--json", help="write the list of results here (rank 0)")
    parser.add_argument("--docs", action="store_true", help="write docs/synthetic.md and .png")
    parser.add_argument("--quick", action="store_true", help="small model, one short iteration")
    args = parser.parse_args()
    if args.quick:
        args.model, args.warmup, args.iters, args.batches_per_iter = "small", 1, 1, 2
    hvd.init()
    note = oversubscription_note(hvd.local_size())
    if note and hvd.rank() == 0:
        print(note, flush=True)
    results = benchmark(args, rows(args.compression))
    n = results[0]["parameters"]
    floors = measure_floors(n, hvd.size())
    for r in results:
        r.update({f"floor_{key}": value for key, value in floors.items()})
    results = relative_to_floors(results)
    if hvd.rank() == 0:
        print(f"Floors: accumulate over n {results[0]['floor_accumulate_ms']:.1f} ms, read of n/P "
              f"{results[0]['floor_read_share_ms']:.1f} ms; " + ", ".join(
                  f"{r['method']} selection {r['selection_x_read']:.1f}x read, extra other "
                  f"{r['extra_other_x_accumulate']:.1f}x accumulate" for r in results), flush=True)
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if hvd.rank() == 0 and args.docs:
        write_docs(results, args)


if __name__ == "__main__":
    main()
