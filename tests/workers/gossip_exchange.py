"""Rank program: gossip optimizers on real ranks; reports every step's parameters.

argv: out mode steps lr [segments] -- mode is crossover, crossover_paper (the
authors' topology sampler), hierarchical, sgp or sgp_one_peer;
segments: a count or name patterns (see ``segments_argument``).
The model is four named tensors in three top-level modules (a, b, c) holding
dyadic values; gradients are the dyadic test stream, so the numpy reference
can be matched bit for bit.
"""

import os
import sys

import numpy as np
import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gradients import dyadic_gradient, split  # noqa: E402
from records import report  # noqa: E402

import horovod_sparse.torch as hs  # noqa: E402
from horovod_sparse.core.gossip import TOPOLOGIES, crossover_routes  # noqa: E402

NAMES = ["a.weight", "a.bias", "b.weight", "c.weight"]
SHAPES = [(6, 5), (6,), (40,), (3, 3)]
SEED = 11


def segments_argument(text):
    """``"2"``: two balanced runs; ``"a.weight;a.bias+b.*;*"``: name patterns, one
    segment per ``;``, several patterns of one segment joined by ``+``."""
    if text.isdigit():
        return int(text)
    return [part.split("+") if "+" in part else part for part in text.split(";")]


def main():
    out, mode, steps, lr = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    segments = segments_argument(sys.argv[5]) if len(sys.argv) > 5 else None
    hvd.init(process_sets="dynamic" if mode == "hierarchical" else None)
    rank, size = hvd.rank(), hvd.size()
    params = [torch.nn.Parameter(torch.from_numpy(v.copy()))
              for v in split(dyadic_gradient(SEED, 1000, rank, SHAPES), SHAPES)]
    named = list(zip(NAMES, params))
    sgd = torch.optim.SGD(params, lr=lr)
    if mode in ("sgp", "sgp_one_peer"):
        optimizer = hs.SGP(sgd, named_parameters=named,
                           schedule="one_peer" if mode == "sgp_one_peer" else "two_peer")
    else:
        optimizer = hs.CrossoverSGD(sgd, named_parameters=named, segments=segments, seed=SEED,
                                    groups=2 if mode == "hierarchical" else None,
                                    topology="paper" if mode == "crossover_paper" else "uniform")
    members = size if mode.startswith("sgp") else len(optimizer.groups)
    flats, routes, perms = [], [], []
    for step in range(steps):
        optimizer.zero_grad()
        if lr:
            for p, g in zip(params, split(dyadic_gradient(SEED, step, rank, SHAPES), SHAPES)):
                p.grad = torch.from_numpy(g.copy())
        optimizer.step()
        flats.append(torch.cat([p.data.reshape(-1) for p in params]).numpy().copy())
        if not mode.startswith("sgp") and members >= 2:
            draw = TOPOLOGIES[optimizer.topology]
            perms.append([draw(SEED, step, s, members) for s in range(len(optimizer.segments))])
            if optimizer.is_leader:
                routes.append(crossover_routes(SEED, step, len(optimizer.segments), members,
                                               optimizer.leaders.index(rank), optimizer.topology))
    report(out, rank, params=np.array(flats), size=size, perms=np.array(perms),
           routes=np.array(routes),
           segments=np.array([len(s) for s in getattr(optimizer, "segments", [])]))


if __name__ == "__main__":
    main()
