"""Rank program: test cases through Horovod's own ``DistributedGradientTape``.

Each rank's loss ``sum(p * g)`` has exactly the deterministic gradient ``g``
of ``tests/gradients.py``; the tape (``groups=1``) exchanges it through
horovod_sparse, eagerly (``--mode eager``) or inside a ``tf.function``
(``--mode function``), and every step's outcome is reported as ``case<i>``
(``records.report``) like ``torch_exchange.py`` does.
"""

import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import SHAPES, dyadic_gradient, split  # noqa: E402
from records import report  # noqa: E402

import horovod_sparse.tensorflow as hs  # noqa: E402


def run_case(method, options, args, rank):
    variables = [tf.Variable(tf.zeros(shape)) for shape in SHAPES]
    compression = hs.Compression.create(method, density=args.density, **options)

    def gradients(targets):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, targets)])
        tape = hvd.DistributedGradientTape(tape, compression=compression, groups=1)
        return tape.gradient(loss, variables)

    if args.mode == "function":
        gradients = tf.function(gradients)
    rows = {key: [] for key in ("aggregate", "residual", "counts", "nnz", "threshold",
                                "elements_sent", "edges", "velocity")}
    for step in range(args.steps):
        targets = [tf.constant(g) for g in split(dyadic_gradient(args.seed, step, rank))]
        aggregate = gradients(targets)
        metrics = compression.metrics()
        saved = compression.state_dict()
        rows["aggregate"].append(np.concatenate([g.numpy().reshape(-1) for g in aggregate]))
        rows["residual"].append(np.concatenate(list(saved["residuals"].values())))
        rows["velocity"].append(np.concatenate(list(saved["velocities"].values()))
                                if "velocities" in saved else [])
        rows["counts"].append(metrics.counts)
        rows["nnz"].append(metrics.nnz)
        rows["threshold"].append(metrics.threshold)
        rows["elements_sent"].append(metrics.elements_sent)
        partition = saved["sparsifier"].get("partition")
        rows["edges"].append(partition["edges"] if partition else [])
    return {key: np.array(value) for key, value in rows.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True, help="JSON list of [method, options]")
    parser.add_argument("--mode", choices=("eager", "function"), required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--density", type=float, default=0.02)
    args = parser.parse_args()
    hvd.init()
    for index, (method, options) in enumerate(json.loads(args.cases)):
        result = run_case(method, options, args, hvd.rank())
        report(args.out, hvd.rank(), f"case{index}", size=hvd.size(), **result)


if __name__ == "__main__":
    main()
