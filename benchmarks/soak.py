"""Soak: thousands of steps of a small model with every method; memory and density error.

    horovodrun -np 2 python benchmarks/soak.py --steps 5000

For each method a fresh MLP (64-128-10 on the bundled digits, batch 16 per
rank) trains ``--steps`` steps through Horovod's DistributedOptimizer.  Rank 0
reports the resident set size (RSS) after the first 100 steps and at the end,
and the density error, mean and max, over each tenth of the run after step 5
(the bound holds throughout, not only on average).  Without ``--quick`` it
rewrites the soak section of ``docs/reliability.md``.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import horovod.torch as hvd

import horovod_sparse
import horovod_sparse.torch as hs
from report import DOCS, Table, error_summary, percent, provenance

sys.path.insert(0, os.path.join(os.path.dirname(DOCS), "examples"))
from digits import load_data, make_model  # noqa: E402

DOC = os.path.join(DOCS, "reliability.md")
BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def soak(method, steps, density):
    torch.manual_seed(0)
    x, y, _, _ = load_data()
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model = make_model(hidden=128)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    named = list(model.named_parameters())
    compression = hs.Compression.create(method, density=density, named_parameters=named)
    momentum = 0.0 if compression.owns_momentum else 0.9
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02,
                                                         momentum=momentum),
                                         named_parameters=named, compression=compression)
    generator = torch.Generator().manual_seed(hvd.rank())
    start_rss, started = None, time.perf_counter()
    errors = np.zeros(steps)
    for step in range(steps):
        batch = torch.randint(0, len(y), (16,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
        errors[step] = compression.metrics().density_error
        if step == min(100, steps - 1):
            start_rss = rss_mib()
    return {"method": method, "rss_start": start_rss, "rss_end": rss_mib(),
            **error_summary(errors), "seconds": time.perf_counter() - started}


def write(rows, args):
    lines = [BEGIN, "", "## Soak", "",
             provenance(f"horovodrun -np {hvd.size()} python benchmarks/soak.py --steps "
                        f"{args.steps}")
             + f": MLP 64-128-10 on digits, density {args.density}. RSS of rank 0 after 100 "
             "steps and at the end; density error of every step after step 5: mean, max, and "
             "the max of each tenth of the run (the bound holds throughout, not only on "
             "average).", "",
             *Table(("method", "method", ""), ("RSS start MiB", "rss_start", ".1f"),
                    ("RSS end MiB", "rss_end", ".1f"),
                    ("growth MiB", lambda r: r["rss_end"] - r["rss_start"], "+.1f"),
                    ("density error mean", percent("error_mean"), ">"),
                    ("max", percent("error_max"), ">"),
                    ("max per tenth", lambda r: " ".join(f"{100 * t:.1f}" for t in r["tenth_max"]), ""),
                    ("s", "seconds", ".0f")).markdown(rows)]
    lines += ["", END]
    text = open(DOC).read()
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + "\n".join(lines) + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    with open(DOC, "w") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--methods", default=",".join(horovod_sparse.available()))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps = 30
    hvd.init()
    rows = []
    for method in args.methods.split(","):
        row = soak(method, args.steps, args.density)
        rows.append(row)
        if hvd.rank() == 0:
            print(f"{method:>10}: RSS {row['rss_start']:.1f} -> {row['rss_end']:.1f} MiB, density "
                  f"error {100 * row['error_mean']:.2f} % mean, {100 * row['error_max']:.2f} % max, "
                  f"{row['seconds']:.0f} s", flush=True)
    if hvd.rank() == 0 and not args.quick:
        write(rows, args)


if __name__ == "__main__":
    main()
