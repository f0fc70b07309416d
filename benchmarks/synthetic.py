"""Synthetic training benchmark in Horovod's format, dense or through a horovod_sparse compressor.

    horovodrun -np 4 python benchmarks/synthetic.py --model wide --compression exdyna --density 0.001

Like Horovod's ``pytorch_synthetic_benchmark.py``: random data, a fixed
model, Horovod's ``DistributedOptimizer``; prints ``Iter #i: X img/sec per
worker``, ``Img/sec per worker: X +-Y`` and ``Total img/sec on N worker(s):
X +-Y``.  Models: ``wide`` (an MLP 4096-4096-2048-1000 on 4096 features,
27.2M parameters: communication-heavy, little compute per parameter) and
``small`` (an MLP 64-256-256-10, 85k parameters).  Besides throughput it
reports the density and bytes per worker per step, and a per-step time
breakdown, as in the Top-k analysis of Shi et al. (2019): forward+backward,
selection and communication (the compressor's own timers; for dense, the
wait in ``synchronize()``), and the rest (optimizer update, copies).
``--json`` writes everything (rank 0); ``--quick`` runs one short iteration.
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
import horovod.torch as hvd

import horovod_sparse
import horovod_sparse.torch as hs

MODELS = {"wide": (4096, [4096, 2048], 1000), "small": (64, [256, 256], 10)}


def make_model(name):
    features, hidden, classes = MODELS[name]
    layers, width = [], features
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes)), features, classes


def benchmark(args):
    torch.manual_seed(0)
    model, features, classes = make_model(args.model)
    named = list(model.named_parameters())
    compression = hvd.Compression.none
    if args.compression != "none":
        compression = hs.Compression.create(args.compression, density=args.density,
                                            named_parameters=named)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.001),
                                         named_parameters=named, compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.randn(args.batch_size, features)
    target = torch.randint(0, classes, (args.batch_size,))
    times = {"forward_backward": [], "synchronize": [], "update": []}

    def step():
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        backward_done = time.perf_counter()
        optimizer.synchronize()
        synchronized = time.perf_counter()
        with optimizer.skip_synchronize():
            optimizer.step()
        done = time.perf_counter()
        times["forward_backward"].append(backward_done - start)
        times["synchronize"].append(synchronized - backward_done)
        times["update"].append(done - synchronized)

    for _ in range(args.warmup):
        step()
    for key in times:
        times[key].clear()
    rates = []
    for iteration in range(args.iters):
        start = time.perf_counter()
        for _ in range(args.batches_per_iter):
            step()
        rate = args.batch_size * args.batches_per_iter / (time.perf_counter() - start)
        rates.append(rate)
        if hvd.rank() == 0:
            print(f"Iter #{iteration}: {rate:.1f} img/sec per worker", flush=True)
    return model, compression, times, np.array(rates)


def report(args, model, compression, times, rates):
    n = sum(p.numel() for p in model.parameters())
    measured = args.iters * args.batches_per_iter
    step_ms = {key: 1000 * float(np.mean(value)) for key, value in times.items()}
    if args.compression == "none":
        selection_ms, communication_ms = 0.0, step_ms["synchronize"]
        density, bytes_per_step = 1.0, 8.0 * n
    else:
        history = compression.history[-measured:]
        selection_ms = 1000 * float(np.mean([m.selection_time for m in history]))
        communication_ms = 1000 * float(np.mean([m.communication_time for m in history]))
        density = float(np.mean([m.density for m in history]))
        bytes_per_step = float(np.mean([m.bytes_sent + m.bytes_received for m in history]))
    total_ms = sum(step_ms.values())
    breakdown = {"forward_backward_ms": step_ms["forward_backward"], "selection_ms": selection_ms,
                 "communication_ms": communication_ms,
                 "other_ms": total_ms - step_ms["forward_backward"] - selection_ms - communication_ms,
                 "step_ms": total_ms}
    size = hvd.size()
    result = {"model": args.model, "parameters": n, "method": args.compression,
              "density_target": args.density if args.compression != "none" else 1.0,
              "ranks": size, "batch_size": args.batch_size,
              "img_sec_per_worker": float(rates.mean()), "img_sec_per_worker_ci": float(1.96 * rates.std()),
              "total_img_sec": float(size * rates.mean()), "total_img_sec_ci": float(size * 1.96 * rates.std()),
              "density": density, "bytes_per_step": bytes_per_step, **breakdown}
    if hvd.rank() == 0:
        print(f"Img/sec per worker: {rates.mean():.1f} +-{1.96 * rates.std():.1f}")
        print(f"Total img/sec on {size} worker(s): {size * rates.mean():.1f} "
              f"+-{size * 1.96 * rates.std():.1f}")
        print(f"Model {args.model}: {n:,} parameters; {args.compression}: density {density:.5f}, "
              f"{bytes_per_step:,.0f} bytes/worker/step")
        print("Step breakdown (ms): " + ", ".join(f"{key[:-3]} {value:.1f}"
                                                 for key, value in breakdown.items()), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="wide")
    parser.add_argument("--compression", default="exdyna", help="none (dense allreduce) or "
                        "a horovod_sparse method: " + ", ".join(horovod_sparse.available()))
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps, not measured")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--batches-per-iter", type=int, default=3)
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--quick", action="store_true", help="small model, one short iteration")
    args = parser.parse_args()
    if args.quick:
        args.model, args.warmup, args.iters, args.batches_per_iter = "small", 1, 1, 2
    hvd.init()
    report(args, *benchmark(args))


if __name__ == "__main__":
    main()
