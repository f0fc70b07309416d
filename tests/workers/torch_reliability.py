"""Rank program: bad inputs through Horovod's DistributedOptimizer.  argv: scenario, out.
Every rank reports what it observed (``records.report``)."""

import os
import sys

import torch
import horovod.torch as hvd

import horovod_sparse.torch as hs
from horovod_sparse.core import ModelMismatchError, NonFiniteGradientError, ParameterDivergenceError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from records import report  # noqa: E402


def optimizer_for(named, **options):
    compression = hs.Compression.create(options.pop("method", "exdyna"), density=options.pop(
        "density", 0.05), named_parameters=named, **options)
    sgd = torch.optim.SGD([p for _, p in named], lr=0.01)
    return hvd.DistributedOptimizer(sgd, named_parameters=named, compression=compression), compression


def dtypes(rank):
    """fp16, bf16, non-contiguous and empty parameters; density 1 makes the sparse
    path an exact average, compared with Horovod's dense one."""
    named = [("half", torch.nn.Parameter(torch.zeros(40, dtype=torch.float16))),
             ("bf16", torch.nn.Parameter(torch.zeros(30, dtype=torch.bfloat16))),
             ("strided", torch.nn.Parameter(torch.zeros(8, 6).t())),
             ("empty", torch.nn.Parameter(torch.zeros(0)))]
    optimizer, compression = optimizer_for(named, method="topk", density=1.0)
    ok = []
    for step in range(3):
        optimizer.zero_grad()
        torch.manual_seed(100 * step + rank)
        loss = sum((p.float() * torch.randn(p.shape)).sum() for _, p in named)
        loss.backward()
        raw = {name: p.grad.clone() for name, p in named}
        optimizer.synchronize()
        for name, p in named:
            expected = hvd.allreduce(raw[name].float().contiguous(), op=hvd.Average,
                                     name=f"check.{name}.{step}")
            ok.append(p.grad.dtype == raw[name].dtype and p.grad.shape == raw[name].shape
                      and torch.equal(p.grad, expected.to(p.grad.dtype)))
        with optimizer.skip_synchronize():
            optimizer.step()
    passthrough = []
    for tensor in (torch.arange(5), torch.tensor([True, False]), torch.zeros(0)):
        compressed, ctx = compression.compress(tensor)
        passthrough.append(compressed is tensor and ctx is None
                           and compression.decompress(compressed, ctx) is tensor)
    return {"averages_exact": all(ok), "passthrough": all(passthrough),
            "float16_on_the_wire": float16_wire(rank)}


def float16_wire(rank):
    """An all-float16 model: values travel as float16 (fewer bytes than the same
    model in float32) and the average equals Horovod's own float16 average."""
    sent, exact = {}, []
    for dtype in (torch.float16, torch.float32):
        named = [("a", torch.nn.Parameter(torch.zeros(50, dtype=dtype))),
                 ("b", torch.nn.Parameter(torch.zeros(7, 3, dtype=dtype)))]
        optimizer, compression = optimizer_for(named, method="topk", density=1.0)
        torch.manual_seed(rank)
        sum((p * torch.randn(p.shape).to(dtype)).sum() for _, p in named).backward()
        raw = {name: p.grad.clone() for name, p in named}
        optimizer.synchronize()
        for name, p in named:
            expected = hvd.allreduce(raw[name], op=hvd.Average, name=f"wire.{name}.{dtype}")
            exact.append(p.grad.dtype == dtype and torch.equal(p.grad, expected))
        sent[dtype] = compression.metrics().bytes_sent
    return all(exact) and sent[torch.float16] < sent[torch.float32]


def mismatch(rank):
    shapes = [(10, 4), (4,)] if rank != 1 else [(10, 4), (5,)]
    named = [(f"p{i}", torch.nn.Parameter(torch.zeros(s))) for i, s in enumerate(shapes)]
    optimizer, _ = optimizer_for(named)
    try:  # raised at the first compress, in backward, before Horovod sees anything
        sum(p.sum() for _, p in named).backward()
        optimizer.step()
    except ModelMismatchError as error:
        return {"raised": "ModelMismatchError", "message": str(error)}
    return {"raised": None}


def nonfinite(rank, policy):
    named = [("w", torch.nn.Parameter(torch.zeros(64)))]
    optimizer, compression = optimizer_for(named, nonfinite=policy)
    seen = []
    for step in range(4):
        optimizer.zero_grad()
        gradient = torch.full((64,), float(rank + 1))
        if step == 2 and rank == 1:
            gradient[7] = float("nan")
        residual_before = compression.state_dict().get("residuals", {}).get("w")
        (named[0][1] * gradient).sum().backward()
        try:
            optimizer.step()
            seen.append("ok" if not compression.metrics().skipped else "skipped")
        except NonFiniteGradientError as error:
            seen.append(f"raised {error.ranks}")
            after = compression.state_dict()["residuals"]["w"]
            seen.append("residual kept" if (after == residual_before).all() else "residual changed")
            break
    return {"seen": seen, "finite": bool(torch.isfinite(named[0][1]).all())}


def diverge(rank):
    named = [("layer.weight", torch.nn.Parameter(torch.ones(16, 4))),
             ("layer.bias", torch.nn.Parameter(torch.ones(4)))]
    optimizer, _ = optimizer_for(named, check_every=1)
    for step in range(3):
        if step == 2 and rank == 1:
            with torch.no_grad():
                named[1][1][0] += 1.0
        optimizer.zero_grad()
        sum(p.sum() for _, p in named).backward()
        try:
            optimizer.step()
        except ParameterDivergenceError as error:
            return {"raised": str(error), "name": error.name, "ranks": error.ranks, "step": step}
    return {"raised": None}


def main():
    hvd.init()
    scenario, rank = sys.argv[1], hvd.rank()
    if scenario == "dtypes":
        result = dtypes(rank)
    elif scenario == "mismatch":
        result = mismatch(rank)
    elif scenario in ("raise", "skip"):
        result = nonfinite(rank, scenario)
    else:
        result = diverge(rank)
    report(sys.argv[2], rank, **result)


if __name__ == "__main__":
    main()
