"""What the digits examples share: the bundled data split and the traffic summary."""

import json

import numpy as np
from sklearn.datasets import load_digits

# Gossip optimizers examples/digits.py trains besides the compressors
# (``hierarchical`` = Crossover-SGD in 2 groups): whole models, no density.
GOSSIP = ("crossover", "hierarchical", "sgp")

# The baseline: Horovod's dense allreduce of every coordinate.
DENSE = "dense"


def canonical(method):
    """``method`` with the dense baseline named ``dense`` (Horovod's own name for
    it, ``none`` as in ``hvd.Compression.none``, is accepted too)."""
    return DENSE if method == "none" else method


def load_split(seed=0):
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to
    [0, 1], shuffled with ``seed`` and split 80 / 20: ``x_train, y_train, x_test, y_test``."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    split = int(0.8 * len(y))
    return x[:split], y[:split], x[split:], y[split:]


def sparse_summary(history):
    """Density, density error, bytes and build-up over a compressor's steps
    (the first 5 left out: thresholds settle there)."""
    late = [m for m in history[5:] if not m.skipped]
    if not late:  # Horovod calls no compressor in a one-process job: nothing was exchanged
        return dict(exchanges=len(history), note="no sparse exchange measured: a one-process "
                    "job exchanges nothing (launch with horovodrun -np 2 or more)")
    errors = np.array([m.density_error for m in late])
    return dict(density=float(np.mean([m.density for m in late])),
                overall_density=float(np.mean([m.overall_density for m in late])),
                density_error_mean=float(errors.mean()), density_error_max=float(errors.max()),
                bytes_per_step=float(np.mean([m.bytes_sent + m.bytes_received for m in late])),
                buildup_mean=float(np.mean([m.buildup for m in late])),
                selection_ms=1000 * float(np.mean([m.selection_time for m in late])),
                communication_ms=1000 * float(np.mean([m.communication_time for m in late])),
                rounds=float(np.mean([m.rounds for m in late])),
                imbalance_mean=float(np.mean([m.imbalance for m in late])))


def dense_summary(n):
    """The same fields for Horovod's dense allreduce: ``n`` floats sent and received."""
    return dict(density=1.0, overall_density=1.0, density_error_mean=0.0, density_error_max=0.0,
                bytes_per_step=8 * n,
                buildup_mean=1.0, imbalance_mean=0.0)


def add_training_arguments(parser):
    """The options both digits examples take besides ``--compression``."""
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--json", help="write the summary here (rank 0)")


def report(summary, path=None):
    """Print a run's summary (its series -- per epoch, per step -- left out) and
    write it all to ``path``."""
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
