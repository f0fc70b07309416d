"""Train an MLP on scikit-learn's bundled digits with Horovod, dense or sparse.

Run on several ranks::

    horovodrun -np 4 python examples/digits.py --compression exdyna --density 0.01

Each rank trains on its shard of the training split (SGD, momentum 0.9 --
inside the compressor for DGC and gs-SGD -- cosine learning-rate decay); Horovod's
``DistributedOptimizer`` averages gradients, densely (``--compression dense``)
or through a horovod_sparse compressor.  Rank 0 prints test accuracy per
epoch and a summary: accuracy, throughput, density, density error and bytes
per step.
"""

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import horovod.torch as hvd

from digits_common import DENSE, add_training_arguments, canonical, load_split, report
from torch_training import add_compression_argument, make_optimizer, traffic_summary


def load_data(seed=0):
    """The digits split (``digits_common.load_split``) as torch tensors."""
    return tuple(torch.from_numpy(array) for array in load_split(seed))


def make_model(hidden=256):
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def train(compression="dense", density=0.01, epochs=30, batch_size=16, lr=0.05, seed=0,
          verbose=True, **options):
    """Train once; return a summary dict (rank 0's model is evaluated; under
    gossip the ranks' models differ, ``disagreement`` says by how much)."""
    compression = canonical(compression)
    torch.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_data()
    rank, size = hvd.rank(), hvd.size()
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    model = make_model()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer, compressor = make_optimizer(compression, model, density, lr, **options)
    steps_per_epoch = len(y_shard) // batch_size
    n = sum(p.numel() for p in model.parameters())
    accuracies, step_times = [], []
    generator = torch.Generator().manual_seed(seed + rank)
    for epoch in range(epochs):
        for group in optimizer.param_groups:  # cosine decay, the same for every method
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * epoch / epochs))
        model.train()
        order = torch.randperm(len(y_shard), generator=generator)
        for step in range(steps_per_epoch):
            batch = order[step * batch_size:(step + 1) * batch_size]
            start = time.perf_counter()
            optimizer.zero_grad()
            F.cross_entropy(model(x_shard[batch]), y_shard[batch]).backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        accuracies.append(accuracy)
        if verbose and rank == 0:
            print(f"[{compression}] epoch {epoch + 1:3d}/{epochs}  test accuracy {accuracy:.4f}",
                  flush=True)
    times = np.array(step_times[steps_per_epoch:] or step_times)
    summary = {"method": compression, "density_target": density if compression != DENSE else 1.0,
               "ranks": size, "parameters": n, "accuracy": accuracies[-1],
               "best_accuracy": max(accuracies), "accuracies": accuracies,
               "samples_per_second": float(batch_size * size / times.mean()),
               "epoch_seconds": float(times.mean() * steps_per_epoch),
               "train_seconds": float(sum(step_times)),  # every step, the first epoch's too
               "density_per_step": [m.density for m in getattr(compressor, "history", [])],
               "dense_step_share": float(np.mean([m.extra.get("fallback", False) for m in
                                                  getattr(compressor, "history", [])] or [1.0])),
               "step_ms": float(1000 * times.mean()),
               "step_ms_median": float(1000 * np.median(times))}
    summary.update(traffic_summary(compression, model, optimizer, compressor))
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_compression_argument(parser)
    add_training_arguments(parser)
    args = parser.parse_args()
    hvd.init(process_sets="dynamic" if args.compression == "hierarchical" else None)
    summary = train(args.compression, args.density, args.epochs, args.batch_size, args.lr)
    if hvd.rank() == 0:
        report(summary, args.json)


if __name__ == "__main__":
    main()
