"""Synthetic training benchmark in Horovod's format, dense or through a horovod_sparse compressor.

    horovodrun -np 4 python benchmarks/synthetic.py --model wide --compression exdyna --density 0.001

Like Horovod's ``pytorch_synthetic_benchmark.py``: random data, a fixed
model, Horovod's ``DistributedOptimizer``; prints ``Iter #i: X img/sec per
worker``, ``Img/sec per worker: X +-Y`` and ``Total img/sec on N worker(s):
X +-Y``.  Models: ``wide`` (an MLP 4096-4096-2048-1000 on 4096 features,
27.2M parameters: communication-heavy, little compute per parameter) and
``small`` (an MLP 64-256-256-10, 85k parameters).  Besides throughput it
reports the density and bytes per worker per step, and a per-step time
breakdown, as in the Top-k analysis of Shi et al. (2019): forward+backward,
selection and communication (the compressor's own timers; for dense, the
wait in ``synchronize()``), and the rest (optimizer update, copies).
``--compression`` takes a comma-separated list (``dense,topk,exdyna``;
``none`` is dense too): the methods run one after the other in the same
job.  ``--json`` writes the list of results (rank 0); ``--docs`` writes
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


def benchmark(args, method):
    if hvd.rank() == 0:
        print(f"Model: {args.model}, compression: {method}"
              + ("" if method == DENSE else f" (density {args.density})"))
        print(f"Batch size: {args.batch_size}\nNumber of workers: {hvd.size()}", flush=True)
    torch.manual_seed(0)
    model, features, classes = make_model(args.model)
    named = list(model.named_parameters())
    compression = hvd.Compression.none
    if method != DENSE:
        name, options = row_options(method)
        compression = hs.Compression.create(name, density=args.density, named_parameters=named,
                                            fallback=args.fallback, **options)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                         named_parameters=named, compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.randn(args.batch_size, features)
    target = torch.randint(0, classes, (args.batch_size,))
    times = {"forward_backward": [], "synchronize": [], "update": []}
    losses = []

    def step():
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        losses.append(loss.item())
        backward_done = time.perf_counter()
        optimizer.synchronize()
        synchronized = time.perf_counter()
        with optimizer.skip_synchronize():
            optimizer.step()
        done = time.perf_counter()
        times["forward_backward"].append(backward_done - start)
        times["synchronize"].append(synchronized - backward_done)
        times["update"].append(done - synchronized)

    for _ in range(args.warmup):
        step()
    for key in times:
        times[key].clear()
    rates = []
    for iteration in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        rate = args.batch_size * args.batches_per_iter / (time.perf_counter() - start)
        rates.append(rate)
        if hvd.rank() == 0:
            print(f"Iter #{iteration}: {rate:.1f} img/sec per worker", flush=True)
    return model, compression, times, np.array(rates), losses[-1]


def report(args, method, model, compression, times, rates, loss):
    n = sum(p.numel() for p in model.parameters())
    step_ms = {key: 1000 * float(np.mean(value)) for key, value in times.items()}
    if method == DENSE:
        summary = {"selection_ms": 0.0, "communication_ms": step_ms["synchronize"], "density": 1.0,
                   "bytes_per_step": 8.0 * n, "dense_step_share": 1.0}
    else:
        summary = summarize(compression.history[-args.iters * args.batches_per_iter:])
    breakdown = {"forward_backward_ms": step_ms["forward_backward"],
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
              "loss": loss, "fallback": args.fallback if method != DENSE else None,
              **summary, **breakdown}
    if hvd.rank() == 0:
        print(f"Img/sec per worker: {rates.mean():.1f} +-{1.96 * rates.std():.1f}")
        print(f"Total img/sec on {size} worker(s): {size * rates.mean():.1f} "
              f"+-{size * 1.96 * rates.std():.1f}")
        print(f"Model {args.model}: {n:,} parameters; {method}: density {result['density']:.5f}, "
              f"{result['bytes_per_step']:,.0f} bytes/worker/step, loss {loss:.4f} at the last step")
        print("Step breakdown (ms): " + ", ".join(f"{key[:-3]} {value:.1f}"
                                                 for key, value in breakdown.items()), flush=True)
    return result


def throughput_table(results, *extra):
    """Throughput, its ratio to dense's and the step breakdown of each result, then
    the ``extra`` columns and bytes per step."""
    dense = next((r for r in results if r["method"] == DENSE), results[0])["total_img_sec"]
    return Table(("method", "method", ""),
                 ("total img/sec",
                  lambda r: f"{r['total_img_sec']:.1f} +-{r['total_img_sec_ci']:.1f}", ">"),
                 ("vs dense", lambda r: f"{r['total_img_sec'] / dense:.2f}x", ">"),
                 ("step ms", "step_ms", ".0f"), ("fwd+bwd", "forward_backward_ms", ".0f"),
                 ("selection", "selection_ms", ".0f"), ("communication", "communication_ms", ".0f"),
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
             "warm-up steps. Breakdown per step (ms): forward+backward; selection and "
             "communication (the compressor's own timers; dense: the wait in `synchronize()`); "
             f"other (accumulate, copies, the optimizer update). {shared}", "",
             "Floors measured in the same run, all ranks at once: one accumulate pass over n "
             f"(read gradient and residual, write acc) {results[0]['floor_accumulate_ms']:.1f} ms; "
             f"one read of n/P {results[0]['floor_read_share_ms']:.1f} ms. *sel/read*: selection "
             "as a multiple of the read; *extra/acc*: the method's other minus dense's other, as a "
             f"multiple of the accumulate pass. {FLOORS_NOTE}", "",
             *throughput_table(results, ("density", "density", ".5f")).markdown(results),
             "", "![throughput](synthetic.png)", ""]
    write_page("synthetic.md", lines)
    with figure("synthetic.png", figsize=(8, 4)) as axis:
        names = [r["method"] for r in results]
        bottom = np.zeros(len(results))
        for key, label in (("forward_backward_ms", "forward+backward"), ("selection_ms", "selection"),
                           ("communication_ms", "communication"), ("other_ms", "other")):
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
    results = [report(args, method, *benchmark(args, method))
               for method in rows(args.compression)]
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
