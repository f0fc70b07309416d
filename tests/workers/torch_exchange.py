"""Rank program: run test cases through Horovod's own ``DistributedOptimizer``.

Each rank feeds the deterministic gradients of ``tests/gradients.py`` (via a
loss whose gradient is exactly that vector), lets Horovod + horovod_sparse
exchange them, and reports what it observed as ``case<i>`` (``records.report``).
"""

import argparse
import json
import os
import socket
import sys

import numpy as np
import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import SHAPES, dyadic_gradient, split  # noqa: E402
from records import report  # noqa: E402

import horovod_sparse.torch as hs  # noqa: E402


def run_case(method, options, args, rank):
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in SHAPES]
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    unnamed = options.pop("unnamed", False)  # built from hyper-parameters alone
    compression = hs.Compression.create(method, density=args.density,
                                        named_parameters=None if unnamed else named, **options)
    placeholders = []
    compress = compression.compress

    def recording_compress(tensor):  # what Horovod's own allreduce will carry
        compressed, ctx = compress(tensor)
        placeholders.append(compressed.numel())
        return compressed, ctx

    compression.compress = recording_compress
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=named,
                                         compression=compression)
    rows = {key: [] for key in ("aggregate", "residual", "counts", "nnz", "threshold",
                                "elements_sent", "elements_received", "edges", "order",
                                "velocity")}
    for step in range(args.steps):
        optimizer.zero_grad()  # torch 2: grads set to None, new tensors each step
        grads = split(dyadic_gradient(args.seed, step, rank, skew=args.skew))
        loss = sum((p * torch.from_numpy(g)).sum() for p, g in zip(params, grads))
        loss.backward()
        optimizer.synchronize()
        metrics = compression.metrics()
        state = compression.state_dict()["sparsifier"]
        # parameters in the compressor's flattening order (named: p0, p1, ...; unnamed: hook order)
        order = [SHAPES.index(tuple(shape)) for shape in compression.layout.shapes]
        rows["order"].append(order)
        rows["aggregate"].append(
            torch.cat([params[i].grad.reshape(-1) for i in order]).numpy().copy())
        saved = compression.state_dict()
        rows["residual"].append(np.concatenate(list(saved["residuals"].values())))
        rows["velocity"].append(np.concatenate(list(saved["velocities"].values()))
                                if "velocities" in saved else [])
        rows["counts"].append(metrics.counts)
        rows["nnz"].append(metrics.nnz)
        rows["threshold"].append(metrics.threshold)
        rows["elements_sent"].append(metrics.elements_sent)
        rows["elements_received"].append(metrics.elements_received)
        rows["edges"].append(state["partition"]["edges"] if state.get("partition") else [])
        with optimizer.skip_synchronize():
            optimizer.step()
    return {key: np.array(value) for key, value in rows.items()} | {
        "placeholder_max": max(placeholders)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True, help="JSON list of [method, options]")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--skew", action="store_true")
    args = parser.parse_args()
    hvd.init()
    for index, (method, options) in enumerate(json.loads(args.cases)):
        result = run_case(method, options, args, hvd.rank())
        report(args.out, hvd.rank(), f"case{index}", size=hvd.size(), host=socket.gethostname(),
               **result)


if __name__ == "__main__":
    main()
