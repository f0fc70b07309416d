"""Training throughput across two emulated hosts joined by a shaped link.

    python benchmarks/multihost.py --rates 1gbit,10gbit    # as root

For each link rate the test bed (``benchmarks/testbed.py``: two network
namespaces with sshd, a veth link shaped by ``tc tbf``) is brought up, and
for each method ``benchmarks/synthetic.py`` (the 27.2M-parameter ``wide``
model) runs under ``horovodrun -H hs-node1:R,hs-node2:R`` (Gloo over ssh)
from host 1, so every allreduce and allgather crosses the link.  ``R``
(``--ranks-per-host``) defaults to one rank per core of a host: the two
emulated hosts share this machine's cores, so 1 here on 2 cores.  Writes
``docs/multihost.md`` (total img/sec, speed-up over dense, step breakdown,
bytes per step, per rate) and ``docs/multihost.png`` (``--page NAME``:
``docs/NAME.*``); the bed is taken down at the end.  ``--quick`` runs dense and ExDyna on the small model, unshaped,
and writes nothing.  ``--demo`` (``make demo``'s second part) runs dense and
ExDyna at 1 Gbit/s, prints img/s and loss side by side and writes nothing;
without root it says how to see it instead.  ``--fallback`` runs dense,
ExDyna and ExDyna with ``fallback="auto"`` at 1 Gbit/s and writes
``docs/fallback_multihost.md``.
"""

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile

from horovod_sparse.core.fallback import AutoFallback
import testbed
from common import DENSE, FLOORS_NOTE, relative_to_floors, rows
from report import Table, figure, provenance, write_page
from synthetic import throughput_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
METHODS = "dense,topk,gtopk,micro,exdyna,deft,gssgd"


def launch_on_bed(slots, arguments, timeout=900):
    """``python arguments...`` under ``horovodrun --gloo`` with ``slots`` ranks on each
    host of the (up) test bed, started from host 1; its stdout, or RuntimeError."""
    command = [os.path.join(BIN, "horovodrun"), "-np", str(2 * slots),
               *testbed.horovodrun_args(slots), "--gloo", sys.executable, *arguments]
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    result = subprocess.run(testbed.on_host1(command), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments)} failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    return result.stdout


@contextlib.contextmanager
def test_bed(program):
    """The bed is taken down at the end, whatever happens; one that cannot be built
    (not root, a tool missing) ends ``program`` with the reason."""
    try:
        yield
    except testbed.TestbedError as error:
        sys.exit(f"{program}: {error}")
    finally:
        if os.geteuid() == 0:
            testbed.down()


def bring_up(rate):
    """Build the bed (or keep it) with its link shaped to ``rate`` (``"unshaped"``: none)."""
    testbed.up(None if rate == "unshaped" else rate)
    print(f"link {rate}:", flush=True)


def run(method, args, out, fallback=None, iters=None):
    arguments = [os.path.join(ROOT, "benchmarks", "synthetic.py"), "--compression", method,
                 "--density", str(args.density), "--json", out]
    arguments += ["--quick"] if args.quick else ["--model", "wide",
                                                 "--iters", str(iters or args.iters)]
    arguments += ["--fallback", fallback] if fallback else []
    stdout = launch_on_bed(args.ranks_per_host, arguments)
    for line in stdout.splitlines():
        if "Total img/sec" in line or "breakdown" in line or line.startswith("Note:"):
            print(f"  {method:>7}: {line.split(':', 1)[-1].strip()}", flush=True)
    with open(out) as f:
        return json.load(f)[0]


def write(results, args):
    page = args.page or "multihost"
    options = f" --methods {args.methods} --page {page}" if args.page else ""
    first = next(iter(results.values()))[0]
    lines = ["# Across two hosts", "",
             provenance(f"python benchmarks/multihost.py --rates {args.rates} --density "
                        f"{args.density}{options}", "as root")
             + ". Two emulated hosts (network namespaces with sshd, `benchmarks/testbed.py`) "
             f"joined by a veth link shaped with `tc tbf` on both ends; {args.ranks_per_host} "
             f"rank(s) per host (`--ranks-per-host {args.ranks_per_host}`), "
             "`horovodrun --gloo` over ssh; `benchmarks/synthetic.py --model wide` "
             f"({first['parameters']:,} parameters, batch {first['batch_size']} per rank, "
             f"density {args.density}). "
             + ("One core per rank: the emulated hosts share the machine's "
                f"{os.cpu_count()} cores. " if 2 * args.ranks_per_host <= os.cpu_count() else
                f"The ranks outnumber the machine's {os.cpu_count()} cores, so every "
                "per-element pass is timed while another rank holds the core. ")
             + "The link is the part a cluster shares. *wait*: a sparse step's wait in "
             "`synchronize()` before its exchange starts (Horovod's round of placeholders, "
             "which also waits for the slower rank's backward pass); other: the exchange's local "
             "work and the optimizer update. *sel/read*: selection as a multiple of "
             "one read of the rank's share; *extra/acc*: the method's other minus dense's, as a "
             f"multiple of one accumulate pass over n (floors measured in each run). {FLOORS_NOTE}",
             ""]
    for rate, rate_rows in results.items():
        lines += [f"## {rate}", "", *throughput_table(rate_rows).markdown(rate_rows), ""]
    write_page(f"{page}.md", lines + [f"![throughput]({page}.png)", ""])
    with figure(f"{page}.png", figsize=(8, 4)) as axis:
        methods = [r["method"] for r in next(iter(results.values()))]
        width = 0.8 / len(results)
        for i, (rate, rate_rows) in enumerate(results.items()):
            axis.bar([j + i * width for j in range(len(methods))],
                     [r["total_img_sec"] for r in rate_rows], width, label=rate)
        axis.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(methods))], methods)
        axis.set(ylabel=f"total img/sec ({2 * args.ranks_per_host} ranks)",
                 title=f"{first['parameters'] / 1e6:.1f}M-parameter MLP across two hosts")
        axis.legend(title="link")


def demo(results):
    """The two-host part of ``make demo``: dense vs the sparse method, side by side."""
    dense = results[0]
    print(f"\nAcross two hosts joined by a 1 Gbit/s link, one rank each, the "
          f"{dense['parameters']:,}-parameter wide model (batch {dense['batch_size']} per rank):")
    table = Table(("method", "method", ""), ("img/s", "total_img_sec", ".1f"),
                  ("vs dense", lambda r: f"{r['total_img_sec'] / dense['total_img_sec']:.2f}x", ">"),
                  ("step ms", "step_ms", ".0f"), ("communication ms", "communication_ms", ".0f"),
                  ("loss", "loss", ".4f"))
    print("\n".join([table.header(), *map(table.line, results)]))
    print(f"The dense allreduce of every parameter takes "
          f"{dense['communication_ms'] / dense['step_ms']:.0%} of dense's step on this link; "
          "the sparse step sends a fraction "
          f"{results[-1]['density_target']} of them (loss: the same random batch, after the same "
          "steps).")


def fallback_run(args, scratch):
    """Where sparse wins: dense, ExDyna, and ExDyna with ``fallback="auto"`` at 1 Gbit/s,
    the fallback run long enough to hold its checks up to the one after the
    confirmed choice (probes included); writes ``docs/fallback_multihost.md``."""
    bring_up("1gbit")
    schedule = AutoFallback()
    # At 1 Gbit/s a dense step costs ~4 sparse ones: the first check chooses sparse,
    # the check confirm_after steps on confirms it, and the next starts
    # (probe + 1) * 3 / probe_cost (~900) steps after that.
    steps = schedule.warmup + schedule.confirm_after \
        + math.ceil(schedule.block * 3 / schedule.probe_cost) + 2 * schedule.block + 20
    iters = -(-steps // 3)  # synthetic.py: 3 batches per iteration, after 3 warm-up steps
    results = [run(DENSE, args, os.path.join(scratch, "dense.json")),
               run("exdyna", args, os.path.join(scratch, "exdyna.json")),
               run("exdyna", args, os.path.join(scratch, "auto.json"), fallback="auto",
                   iters=iters)]
    dense, sparse, auto = (r["total_img_sec"] for r in results)
    kept = (auto - dense) / (sparse - dense)
    step_d, step_s = results[0]["step_ms"], results[1]["step_ms"]
    gap = schedule.block * abs(step_d - step_s) / (schedule.probe_cost * min(step_d, step_s))
    lines = ["# fallback=\"auto\" where sparse wins", "",
             provenance("python benchmarks/multihost.py --fallback", "as root")
             + f": the wide model ({results[0]['parameters']:,} parameters, density "
             f"{args.density}) across the two-host bed at 1 Gbit/s, one rank per host.  The "
             f"fallback run times {3 * iters} steps after 3 warm-up ones: its "
             f"{schedule.warmup} warm-up steps, its first check ({schedule.block} sparse and "
             f"{schedule.block} dense steps, the first of each kind untimed), the check "
             f"{schedule.confirm_after} steps later that confirms a sparse first choice, and the "
             f"steps after it, towards the next check {schedule.block} |D - S| / "
             f"({schedule.probe_cost} min(D, S)) steps after that one (D and S the dense and "
             "sparse step times; here D = "
             f"{step_d:.0f} ms and S = {step_s:.0f} ms: {gap:.0f} steps).", "",
             *Table(("run", lambda r: r["method"] + (", fallback=auto" if r["fallback"] else ""), ""),
                    ("total img/sec", "total_img_sec", ".1f"),
                    ("vs dense", lambda r: f"{r['total_img_sec'] / dense:.2f}x", ">"),
                    ("dense steps", "dense_step_share", ".1%")).markdown(results),
             "", f"Share of ExDyna's speed-up over dense that the fallback keeps: {kept:.0%} "
             f"(target 90 %: {'met' if kept >= 0.9 else 'missed'}).", ""]
    print("\n".join(lines))
    write_page("fallback_multihost.md", lines)


DEMO_HINT = ("Sparse training pays where the network is the bottleneck, which one host is not. "
             "Run `make demo` as root to also train a 27.2M-parameter model across two emulated "
             "hosts joined by a 1 Gbit/s link (dense vs ExDyna), or see docs/multihost.md.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1gbit,10gbit", help="tc rates, comma-separated")
    parser.add_argument("--methods", default=METHODS, help="comma-separated; dense (or none) = "
                        "Horovod's allreduce")
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--ranks-per-host", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="default: one per core of an emulated host (the two share the cores)")
    parser.add_argument("--page", help="write docs/PAGE.* instead of docs/multihost.*")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--demo", action="store_true")
    parser.add_argument("--fallback", action="store_true",
                        help="ExDyna with and without fallback=\"auto\" at 1 Gbit/s")
    args = parser.parse_args()
    if args.fallback:
        with test_bed("multihost"), tempfile.TemporaryDirectory() as scratch:
            fallback_run(args, scratch)
        return
    if args.quick:
        args.rates, args.methods = "unshaped", "dense,exdyna"
    if args.demo:
        if os.geteuid() != 0:
            print(DEMO_HINT)
            return
        args.rates, args.methods, args.iters = "1gbit", "dense,exdyna", 2
    results = {}
    with test_bed("multihost"), tempfile.TemporaryDirectory() as scratch:
        for rate in args.rates.split(","):
            bring_up(rate)
            results[rate] = relative_to_floors(
                [run(m, args, os.path.join(scratch, f"{rate}-{i}.json"))
                 for i, m in enumerate(rows(args.methods))])
    if args.demo:
        demo(results["1gbit"])
    elif not args.quick:
        write(results, args)


if __name__ == "__main__":
    main()
