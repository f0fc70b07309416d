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


class Training:
    """One training run, an epoch at a time (so that runs can take turns: see
    ``benchmarks/fallback.py``); :func:`train` runs one to the end."""

    def __init__(self, compression="dense", density=0.01, epochs=30, batch_size=16, lr=0.05,
                 seed=0, verbose=True, **options):
        self.compression, self.density = canonical(compression), density
        self.epochs, self.batch_size, self.lr, self.verbose = epochs, batch_size, lr, verbose
        torch.manual_seed(seed)
        x_train, y_train, self.x_test, self.y_test = load_data()
        rank, size = hvd.rank(), hvd.size()
        self.x_shard, self.y_shard = x_train[rank::size], y_train[rank::size]
        self.model = make_model()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.optimizer, self.compressor = make_optimizer(self.compression, self.model, density,
                                                         lr, **options)
        self.steps_per_epoch = len(self.y_shard) // batch_size
        self.accuracies, self.step_times = [], []
        self.generator = torch.Generator().manual_seed(seed + rank)

    def epoch(self):
        """Train one epoch, then evaluate rank 0's model on the test split."""
        epoch, model, optimizer = len(self.accuracies), self.model, self.optimizer
        for group in optimizer.param_groups:  # cosine decay, the same for every method
            group["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * epoch / self.epochs))
        model.train()
        for batch in self.epoch_batches():
            self.step_times.append(self.step(batch))
        model.eval()
        with torch.no_grad():
            accuracy = float((model(self.x_test).argmax(1) == self.y_test).float().mean())
        self.accuracies.append(accuracy)
        if self.verbose and hvd.rank() == 0:
            print(f"[{self.compression}] epoch {epoch + 1:3d}/{self.epochs}  test accuracy "
                  f"{accuracy:.4f}", flush=True)

    def epoch_batches(self):
        """An epoch's batches of the shard (sample indices), freshly shuffled."""
        order = torch.randperm(len(self.y_shard), generator=self.generator)
        for step in range(self.steps_per_epoch):
            yield order[step * self.batch_size:(step + 1) * self.batch_size]

    def step(self, batch):
        """One training step on the shard's samples ``batch``; its seconds."""
        start = time.perf_counter()
        self.optimizer.zero_grad()
        F.cross_entropy(self.model(self.x_shard[batch]), self.y_shard[batch]).backward()
        self.optimizer.step()
        return time.perf_counter() - start

    def summary(self):
        """Accuracy, throughput (the epochs after the first), density and traffic."""
        compression, compressor, size = self.compression, self.compressor, hvd.size()
        times = np.array(self.step_times[self.steps_per_epoch:] or self.step_times)
        history = getattr(compressor, "history", [])
        summary = {"method": compression,
                   "density_target": self.density if compression != DENSE else 1.0,
                   "ranks": size, "parameters": sum(p.numel() for p in self.model.parameters()),
                   "accuracy": self.accuracies[-1], "best_accuracy": max(self.accuracies),
                   "accuracies": self.accuracies,
                   "samples_per_second": float(self.batch_size * size / times.mean()),
                   "epoch_seconds": float(times.mean() * self.steps_per_epoch),
                   "train_seconds": float(sum(self.step_times)),  # every step, the first epoch's too
                   "density_per_step": [m.density for m in history],
                   "dense_step_share": float(np.mean([m.extra.get("fallback", False)
                                                      for m in history] or [1.0])),
                   "step_ms": float(1000 * times.mean()),
                   "step_ms_median": float(1000 * np.median(times))}
        summary.update(traffic_summary(compression, self.model, self.optimizer, compressor))
        return summary


def train(compression="dense", density=0.01, epochs=30, batch_size=16, lr=0.05, seed=0,
          verbose=True, **options):
    """Train once; return a summary dict (rank 0's model is evaluated; under
    gossip the ranks' models differ, ``disagreement`` says by how much)."""
    training = Training(compression, density, epochs, batch_size, lr, seed, verbose, **options)
    for _ in range(epochs):
        training.epoch()
    return training.summary()


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
