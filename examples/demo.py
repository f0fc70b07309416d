"""`make demo`: train on the bundled digits with dense allreduce, then ExDyna, on the same ranks.

Launched as ``horovodrun -np 4 python examples/demo.py``; rank 0 shows
progress and ends with a side-by-side table.
"""

import argparse
import os
import sys

import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits import train  # noqa: E402

COLUMNS = [("method", "{:>8}"), ("accuracy", "{:>8.2%}"), ("samples_per_second", "{:>10.0f}"),
           ("density", "{:>8.4f}"), ("density_error_mean", "{:>9.2%}"),
           ("density_error_max", "{:>9.2%}"), ("bytes_per_step", "{:>11,.0f}")]
HEADERS = ["method", "accuracy", "samples/s", "density", "dens.err", "err.max", "bytes/step"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="dense,topk,exdyna")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    hvd.init()
    results = [train(method, args.density, epochs=args.epochs)
               for method in args.methods.split(",")]
    if hvd.rank() == 0:
        widths = [len(fmt.format(results[0][key])) for key, fmt in COLUMNS]
        print(f"\n{hvd.size()} ranks, {results[0]['parameters']:,} parameters, "
              f"target density {args.density} (dense row: every coordinate)")
        print("  ".join(h.rjust(w) for h, w in zip(HEADERS, widths)))
        for result in results:
            print("  ".join(fmt.format(result[key]) for key, fmt in COLUMNS))
        dense = results[0]
        for result in results[1:]:
            print(f"{result['method']}: {dense['bytes_per_step'] / result['bytes_per_step']:.1f}x "
                  f"fewer bytes per step than dense; accuracy "
                  f"{100 * (result['accuracy'] - dense['accuracy']):+.2f} points")
        for result in results[1:]:
            if result["samples_per_second"] < dense["samples_per_second"]:
                print(why_slower(result, dense))


def why_slower(result, dense):
    """A sparse row slower than dense, explained from its own measurements."""
    return (f"Why is {result['method']} slower here ({result['samples_per_second']:,.0f} vs "
            f"{dense['samples_per_second']:,.0f} samples/s)? Its step takes "
            f"{result['step_ms']:.1f} ms against dense's {dense['step_ms']:.1f}: selection "
            f"{result['selection_ms']:.1f} ms and {result['rounds']:.0f} collective rounds "
            f"({result['communication_ms']:.1f} ms), where dense sends all "
            f"{dense['parameters']:,} parameters in one allreduce that costs little between "
            "ranks of one machine. The saving is in bytes, and bytes only cost time on a slow "
            "link: see the two-host run that follows (as root) or docs/multihost.md.")


if __name__ == "__main__":
    main()
