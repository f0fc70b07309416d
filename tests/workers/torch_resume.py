"""Rank program: train straight for 12 steps, and 7 steps + checkpoint + fresh objects + 5.

Also trains straight with gradients zeroed in place instead of set to None
(then ``p.grad`` is a view of the compressor's output buffer): same result.

Model and optimizer state are saved by rank 0, the compressor state (its
residuals are per rank) by every rank; every rank reports whether the resumed
run reproduced the uninterrupted one bit for bit.
"""

import json
import os
import sys

import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import dyadic_gradient  # noqa: E402

import horovod_sparse.torch as hs  # noqa: E402

STEPS, SPLIT = 12, 7


def build(method):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
    compression = hs.Compression.create(method, density=0.05,
                                        named_parameters=model.named_parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         compression=compression)
    return model, optimizer, compression


def train(model, optimizer, steps, set_to_none=True):
    for step in steps:
        x = torch.from_numpy(dyadic_gradient(3, step, hvd.rank(), shapes=[(16, 40)]).reshape(16, 40))
        if set_to_none:
            optimizer.zero_grad()
        else:  # gradients zeroed in place: p.grad stays a view of the compressor's output
            for parameter in model.parameters():
                if parameter.grad is not None:
                    parameter.grad.zero_()
        model(x).square().mean().backward()
        optimizer.step()


def main():
    method, path = sys.argv[1], sys.argv[2]
    hvd.init()
    model, optimizer, _ = build(method)
    train(model, optimizer, range(STEPS))
    straight = [p.detach().clone() for p in model.parameters()]
    model, optimizer, _ = build(method)
    train(model, optimizer, range(STEPS), set_to_none=False)
    in_place = all(torch.equal(a, b) for a, b in zip(straight, model.parameters()))

    model, optimizer, compression = build(method)
    train(model, optimizer, range(SPLIT))
    if hvd.rank() == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    torch.save(compression.state_dict(), f"{path}.rank{hvd.rank()}")
    hvd.allreduce(torch.zeros(1), name="checkpoint_written")

    model, optimizer, compression = build(method)
    checkpoint = torch.load(path, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    compression.load_state_dict(torch.load(f"{path}.rank{hvd.rank()}", weights_only=False))
    train(model, optimizer, range(SPLIT, STEPS))
    same = all(torch.equal(a, b) for a, b in zip(straight, model.parameters()))
    print(json.dumps({"rank": hvd.rank(), "method": method, "bit_identical": same,
                      "in_place_zeroing_identical": in_place}), flush=True)


if __name__ == "__main__":
    main()
