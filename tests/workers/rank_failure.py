"""Rank program: train with ExDyna; at step ``kill_step`` rank ``victim`` SIGKILLs
itself (after writing the time to ``<out>/killed``).  The survivors keep
calling collectives; the launcher must notice and end the job."""

import os
import signal
import sys
import time

import torch
import horovod.torch as hvd

import horovod_sparse.torch as hs


def main():
    out, kill_step, victim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    hvd.init()
    model = torch.nn.Linear(64, 32)
    compression = hs.Compression.exdyna(density=0.05, named_parameters=model.named_parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters(),
                                         compression=compression)
    for step in range(100_000):
        if step == kill_step and hvd.rank() == victim:
            with open(os.path.join(out, "killed"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        model(torch.randn(8, 64)).square().mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
