"""Per-worker selection cost of every method next to two references, single process.

For each model size ``n``, density ``d`` and worker count ``P`` this times,
on the same random heavy-tailed gradient:

* ``topk_n``: ``torch.topk`` over the whole vector (what Top-k does);
* ``pass_share``: one elementwise pass over the worker's share (``abs`` of
  ``n/P`` elements), the practical floor;
* ``topk``: horovod_sparse's Top-k selection (topk + deterministic tie rule);
* ``micro`` / ``exdyna``: the partition family's selection (one compare pass
  over ``n/P`` at the ladder's lowest rung, candidate values, ladder counts,
  final filter) with the ladder placed as in steady state;
* ``deft``: segment norms over ``n`` plus top-``k_l`` in ``1/P`` of the segments.

Prints milliseconds and ratios, and writes ``docs/selection_cost.md`` and
``docs/selection_cost.png``.  ``--quick`` runs one small size (smoke test).
"""

import argparse
import os
import time

import numpy as np
import torch

from horovod_sparse.core.methods.deft import deft_budgets
from horovod_sparse.core.methods.exclusive import ladder_candidates
from horovod_sparse.core.threshold import AdaptiveControl
from horovod_sparse.torch.ops import TorchOps

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


def best_time(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def measure(n, density, size, repeats):
    ops = TorchOps()
    acc = torch.from_numpy(np.random.default_rng(0).standard_t(3, n).astype(np.float32))
    k = max(1, int(density * n))
    share = n // size
    threshold = float(torch.topk(acc.abs(), k).values.min())
    control = AdaptiveControl()
    control.low = 0.8  # steady state on heavy tails (see docs/methods.md)
    rungs = control.rungs(threshold)

    def partition_selection():
        candidates, values, ladder = ladder_candidates(ops, acc, rungs, 0, share)
        chosen = int(np.argmin(np.abs(np.log(np.maximum(ladder * size, 1) / k))))
        ops.select_abs_ge(candidates, values, rungs[chosen])

    segment = max(1, n // (8 * size))
    bounds = [(s, min(s + segment, n)) for s in range(0, n, segment)]

    def deft_selection():
        norms = np.sqrt(ops.segment_sq_norms(acc, bounds))
        budgets = deft_budgets(norms, [e - s for s, e in bounds], k)
        for l in range(0, len(bounds), size):
            ops.topk_abs_indices(acc, int(budgets[l]), *bounds[l])

    row = {"n": n, "density": density, "P": size,
           "topk_n": best_time(lambda: torch.topk(acc.abs(), k), repeats),
           "pass_share": best_time(lambda: acc[:share].abs(), repeats),
           "topk": best_time(lambda: ops.topk_abs_indices(acc, k, 0, n), repeats),
           "micro": best_time(partition_selection, repeats),
           "deft": best_time(deft_selection, repeats)}
    row["exdyna"] = row["micro"]  # same selection code; only the partition bounds differ
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small size, no files written")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000, 25_600_000]
    densities = [0.01] if args.quick else [0.01, 0.001]
    workers = [4] if args.quick else [4, 8, 16, 64]
    rows = []
    header = (f"{'n':>10} {'d':>6} {'P':>3} {'topk(n)':>9} {'pass(n/P)':>9} {'topk':>8} "
              f"{'exdyna':>8} {'deft':>8} {'exdyna/pass':>11} {'topk(n)/exdyna':>14}")
    print(header)
    for n in sizes:
        for density in densities:
            for size in workers:
                row = measure(n, density, size, 1 if args.quick else args.repeats)
                rows.append(row)
                print(f"{n:>10,} {density:>6} {size:>3} {row['topk_n']:>9.2f} {row['pass_share']:>9.2f} "
                      f"{row['topk']:>8.2f} {row['exdyna']:>8.2f} {row['deft']:>8.2f} "
                      f"{row['exdyna'] / row['pass_share']:>11.2f} "
                      f"{row['topk_n'] / row['exdyna']:>14.1f}", flush=True)
    if not args.quick:
        write_docs(rows)


def write_docs(rows):
    import platform

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = ["# Selection cost per worker", "",
             f"`python benchmarks/selection_cost.py` on {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, one torch thread, {time.strftime('%Y-%m-%d')}. "
             "Milliseconds, best of 3, on a Student-t (3 dof) float32 gradient.", "",
             "| n | d | P | torch.topk(n) | one pass n/P | Top-k | MiCRO/ExDyna | DEFT | "
             "ExDyna / pass | topk(n) / ExDyna |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['density']} | {r['P']} | {r['topk_n']:.2f} | "
                     f"{r['pass_share']:.2f} | {r['topk']:.2f} | {r['exdyna']:.2f} | {r['deft']:.2f} | "
                     f"{r['exdyna'] / r['pass_share']:.2f} | {r['topk_n'] / r['exdyna']:.1f} |")
    with open(os.path.join(DOCS, "selection_cost.md"), "w") as f:
        f.write("\n".join(lines) + "\n\n![selection cost](selection_cost.png)\n")
    figure, axis = plt.subplots(figsize=(7, 4))
    for method, style in (("topk_n", "k-"), ("pass_share", "k:"), ("exdyna", "C0o-"), ("deft", "C1s-")):
        picked = [r for r in rows if r["n"] == 25_600_000 and r["density"] == 0.001]
        axis.plot([r["P"] for r in picked], [r[method] for r in picked], style, label=method)
    axis.set(xscale="log", yscale="log", xlabel="workers P", ylabel="ms per worker",
             title="selection, n = 25.6M, d = 0.001")
    axis.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(DOCS, "selection_cost.png"), dpi=100)


if __name__ == "__main__":
    main()
