"""Gradient exchange time of every method against dense allreduce, on real ranks.

    horovodrun -np 4 python benchmarks/sparse_allreduce.py --elements 25600000 --density 0.001

Each rank holds a synthetic heavy-tailed gradient stream (Student-t, 3 dof,
a per-rank base vector rescaled every step); every method exchanges it
through the same core path the PyTorch compressor uses (Horovod
collectives), and dense is ``hvd.allreduce`` of the same tensor.  Reported
per step (median over the measured steps, after warm-up): selection and
communication time, total exchange time, bytes sent+received per worker,
density error, build-up and imbalance.  Rank 0 writes
``docs/sparse_allreduce.md`` unless ``--quick``.
"""

import argparse
import os
import platform
import time

import numpy as np
import torch
import horovod.torch as hvd

from horovod_sparse.core import GradientExchange, Layout, create
from horovod_sparse.torch.comm import HorovodTorchCommunicator
from horovod_sparse.torch.ops import TorchOps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_method(method, base, density, steps, warmup):
    layout = Layout(("gradient",), ((base.numel(),),), ("torch.float32",))
    exchange = GradientExchange(create(method, density=density), TorchOps(),
                                HorovodTorchCommunicator())
    totals = []
    for step in range(warmup + steps):
        grad = base * (1.0 + 0.5 * np.sin(step))
        start = time.perf_counter()
        exchange.step([grad], layout)
        totals.append(time.perf_counter() - start)
    late = list(exchange.history)[warmup:]
    return {"method": method, "total_ms": 1e3 * np.median(totals[warmup:]),
            "selection_ms": 1e3 * np.median([m.selection_time for m in late]),
            "communication_ms": 1e3 * np.median([m.communication_time for m in late]),
            "bytes": np.mean([m.bytes_sent + m.bytes_received for m in late]),
            "density_error": np.mean([m.density_error for m in late]),
            "buildup": np.mean([m.buildup for m in late]),
            "imbalance": np.mean([m.imbalance for m in late])}


def run_dense(base, steps, warmup):
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        hvd.allreduce(base, op=hvd.Average, name="dense")
        times.append(time.perf_counter() - start)
    n = base.numel()
    return {"method": "dense", "total_ms": 1e3 * np.median(times[warmup:]), "selection_ms": 0.0,
            "communication_ms": 1e3 * np.median(times[warmup:]), "bytes": 8.0 * n,
            "density_error": 0.0, "buildup": 1.0, "imbalance": 0.0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=25_600_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--methods", default="topk,micro,exdyna,deft")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.elements, args.steps, args.warmup = 200_000, 2, 1
    hvd.init()
    torch.set_num_threads(1)
    rng = np.random.default_rng(hvd.rank())
    base = torch.from_numpy(rng.standard_t(3, args.elements).astype(np.float32))
    rows = [run_dense(base, args.steps, args.warmup)]
    for method in args.methods.split(","):
        rows.append(run_method(method, base, args.density, args.steps, args.warmup))
    if hvd.rank() != 0:
        return
    dense = rows[0]["total_ms"]
    print(f"{'method':>8} {'total ms':>9} {'select':>8} {'comm':>8} {'bytes/worker':>13} "
          f"{'dens.err':>8} {'build-up':>8} {'imbal.':>7} {'dense/x':>8}")
    for r in rows:
        print(f"{r['method']:>8} {r['total_ms']:>9.1f} {r['selection_ms']:>8.1f} "
              f"{r['communication_ms']:>8.1f} {r['bytes']:>13,.0f} {r['density_error']:>8.4f} "
              f"{r['buildup']:>8.3f} {r['imbalance']:>7.3f} {dense / r['total_ms']:>8.1f}", flush=True)
    if not args.quick:
        lines = ["# Sparse gradient exchange vs dense allreduce", "",
                 f"`horovodrun -np {hvd.size()} python benchmarks/sparse_allreduce.py --elements "
                 f"{args.elements} --density {args.density}` (Gloo, {hvd.size()} ranks on one "
                 f"{os.cpu_count()}-core {platform.machine()} machine, loopback; "
                 f"{time.strftime('%Y-%m-%d')}). Median per step after {args.warmup} warm-up steps. "
                 "Bytes: logical payload sent + received per worker (dense: the allreduced vector "
                 "once each way).", "",
                 "| method | exchange ms | selection ms | communication ms | bytes / worker | "
                 "density error | build-up | imbalance | dense / method |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['method']} | {r['total_ms']:.1f} | {r['selection_ms']:.1f} | "
                         f"{r['communication_ms']:.1f} | {r['bytes']:,.0f} | {r['density_error']:.4f} | "
                         f"{r['buildup']:.3f} | {r['imbalance']:.3f} | {dense / r['total_ms']:.1f}x |")
        with open(os.path.join(ROOT, "docs", "sparse_allreduce.md"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
