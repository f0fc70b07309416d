"""Rank program: checkpoint and resume through Horovod's DistributedOptimizer.

``torch_resume.py resume <methods> <dir>``: per method, train straight for 12
steps; again with gradients zeroed in place instead of set to None (then
``p.grad`` is a view of the compressor's output buffer); then 7 steps, a
checkpoint, fresh objects, the last 5 steps -- from per-rank compressor files
(each rank saves its own state) and from one file rank 0 alone writes
(``state_dict(all_ranks=True)``).  All must equal the straight run bit for bit.

``torch_resume.py carry-over <methods> <dir>``: on another number of ranks,
load rank 0's file: every rank's residual (and velocity) must be the mean of
the old ranks', the step kept; training goes on with the ranks identical.

Every rank reports ``checks``: ``{name: true | message}`` to ``<dir>``, under the
phase's name (``records.report``).
"""

import os
import sys

import numpy as np
import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import dyadic_gradient  # noqa: E402
from records import report  # noqa: E402

import horovod_sparse.torch as hs  # noqa: E402

STEPS, SPLIT = 12, 7


def build(method):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
    compression = hs.Compression.create(method, density=0.05,
                                        named_parameters=model.named_parameters())
    momentum = 0.0 if compression.owns_momentum else 0.9
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1,
                                                         momentum=momentum),
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


def resume(method, directory):
    """Checks of one method at this rank count (see the module docstring)."""
    hvd_rank = hvd.rank()
    model, optimizer, _ = build(method)
    train(model, optimizer, range(STEPS))
    straight = [p.detach().clone() for p in model.parameters()]
    model, optimizer, _ = build(method)
    train(model, optimizer, range(STEPS), set_to_none=False)
    checks = {"in-place zeroing identical": _same(straight, model)}

    model, optimizer, compression = build(method)
    train(model, optimizer, range(SPLIT))
    path = os.path.join(directory, f"{method}.pt")
    if hvd_rank == 0:  # model and optimizer: rank 0; the compressor: every rank its own
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    torch.save(compression.state_dict(), f"{path}.rank{hvd_rank}")
    gathered = compression.state_dict(all_ranks=True)  # every rank calls; rank 0 writes
    if hvd_rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "compression": gathered}, f"{path}.all")
    hvd.allreduce(torch.zeros(1), name=f"{method}.written")

    for mode in ("per-rank", "gathered"):
        model, optimizer, compression = build(method)
        saved = torch.load(path if mode == "per-rank" else f"{path}.all", weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        compression.load_state_dict(torch.load(f"{path}.rank{hvd_rank}", weights_only=False)
                                    if mode == "per-rank" else saved["compression"])
        train(model, optimizer, range(SPLIT, STEPS))
        checks[f"{mode} resume bit-identical"] = _same(straight, model)
    return checks


def carry_over(method, directory):
    """Resume a gathered checkpoint written on another number of ranks."""
    saved = torch.load(os.path.join(directory, f"{method}.pt.all"), weights_only=False)
    old = saved["compression"]["ranks"]
    model, optimizer, compression = build(method)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    compression.load_state_dict(saved["compression"])
    own = compression.state_dict()
    checks = {"rank count changed": len(old) != hvd.size(), "step kept": own["step"] == SPLIT}
    for group in ("residuals", "velocities"):
        for name, value in old[0].get(group, {}).items():
            mean = np.mean([state[group][name] for state in old], axis=0, dtype=np.float64)
            checks[f"{group} {name} = mean of the old ranks'"] = bool(
                np.array_equal(own[group][name], mean.astype(np.float32)))
    train(model, optimizer, range(SPLIT, STEPS))
    checks["training goes on, finite"] = all(bool(torch.isfinite(p).all())
                                             for p in model.parameters())
    try:
        hs.check_parameters(model.named_parameters())
        checks["ranks identical"] = True
    except Exception as error:  # noqa: BLE001 -- reported, not raised
        checks["ranks identical"] = str(error)
    return checks


def _same(expected, model):
    return all(torch.equal(a, b) for a, b in zip(expected, model.parameters()))


def main():
    phase, methods, directory = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    hvd.init()
    run = {"resume": resume, "carry-over": carry_over}[phase]
    checks = {f"{method}: {name}": value for method in methods
              for name, value in run(method, directory).items()}
    report(directory, hvd.rank(), phase, checks=checks)


if __name__ == "__main__":
    main()
