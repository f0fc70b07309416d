"""What the PyTorch examples share: the ``--compression`` option, the optimizer
for a method and the run's traffic summary."""

import horovod.torch as hvd
import torch

import horovod_sparse
import horovod_sparse.torch as hs
from digits_common import DENSE, GOSSIP, dense_summary, sparse_summary


def add_compression_argument(parser):
    parser.add_argument("--compression", default="exdyna", help="dense (or none), a "
                        "horovod_sparse method (" + ", ".join(horovod_sparse.available())
                        + ") or a gossip optimizer (" + ", ".join(GOSSIP) + ")")


def make_optimizer(method, model, density, lr, **options):
    """``(optimizer, compressor)`` for ``method`` (named as by
    ``digits_common.canonical``): ``dense`` (Horovod's dense allreduce), a
    horovod_sparse compressor name, or a gossip optimizer
    (``crossover``, ``hierarchical`` = Crossover-SGD in 2 groups, ``sgp``);
    SGD with momentum 0.9 underneath."""
    named = list(model.named_parameters())
    if method in GOSSIP:
        sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        if method == "sgp":
            return hs.SGP(sgd, named_parameters=named), None
        return hs.CrossoverSGD(sgd, named_parameters=named, **options,
                               groups=2 if method == "hierarchical" else None), None
    compressor, momentum = hvd.Compression.none, 0.9
    if method != DENSE:
        compressor = hs.Compression.create(method, density=density, named_parameters=named,
                                           **options)
        # DGC and gs-SGD apply momentum inside the compressor (momentum
        # correction): the optimizer must then not add it again.
        momentum = 0.0 if compressor.owns_momentum else 0.9
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr,
                                                         momentum=momentum),
                                         named_parameters=named, compression=compressor)
    return optimizer, compressor


def traffic_summary(method, model, optimizer, compressor):
    """Density, density error, build-up, imbalance and bytes per step of the run,
    and ``disagreement``: max |x_r - mean_r x| over the parameters (non-zero only
    under gossip, whose ranks' models differ by design)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mean = hvd.allreduce(flat, op=hvd.Average, name="example.disagreement")
    summary = {"disagreement": float((flat - mean).abs().max()),
               "owns_momentum": bool(compressor is not None and method != DENSE
                                     and compressor.owns_momentum)}
    if method in GOSSIP:
        traffic = optimizer.traffic or {"bytes_sent": 0, "bytes_received": 0}
        summary.update(density=1.0, overall_density=1.0, density_error_mean=0.0,
                       density_error_max=0.0,
                       bytes_per_step=traffic["bytes_sent"] + traffic["bytes_received"],
                       buildup_mean=1.0, imbalance_mean=0.0)
    elif method == DENSE:
        summary.update(dense_summary(flat.numel()))
    else:
        summary.update(sparse_summary(compressor.history))
    return summary
