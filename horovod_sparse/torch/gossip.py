"""Gossip optimizers on Horovod's collectives: Crossover-SGD and its SGP baseline.

Decentralized parameter averaging (Yeo et al., "Crossover-SGD"; Assran et
al., "Stochastic Gradient Push", ICML 2019): no gradient allreduce; every
rank applies its own gradient, then mixes its parameters with peers'.  The
wrappers look like Horovod's ``DistributedOptimizer``: wrap a torch
optimizer, call ``zero_grad``/``backward``/``step`` as usual::

    optimizer = horovod_sparse.torch.CrossoverSGD(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters())

Each step's exchange is one Horovod ``alltoall`` with per-rank splits (Gloo
and MPI alike), every member sending and receiving in the same call, so no
``P`` (odd included) can deadlock.  Before the first exchange the ranks compare
their models (names, shapes, dtypes) and configurations, so ranks that differ
raise :class:`~horovod_sparse.core.ModelMismatchError` (or
``ConfigurationMismatchError``) everywhere instead of mixing misaligned values.  Ranks' models differ between steps by
design; evaluate any rank's model, or average them at the end.
"""

import itertools

import horovod.torch as hvd
import torch

from ..core import Layout
from ..core.exchange import agree
from ..core.gossip import (SGP_SCHEDULES, TOPOLOGIES, balanced_segments, crossover_routes,
                           hierarchical_groups, named_segments, sgp_peer_distances)
from ..core.arguments import check_choice, check_integer
from .comm import HorovodTorchCommunicator


class _GossipOptimizer:
    """Local step, then :meth:`gossip`; delegates everything else to the optimizer."""

    def __init__(self, optimizer, named_parameters=None):
        self.optimizer = optimizer
        self.parameters = [p for group in optimizer.param_groups for p in group["params"]]
        names = {id(p): name for name, p in (named_parameters or [])}
        self.names = [names.get(id(p), f"param.{i}") for i, p in enumerate(self.parameters)]
        self.step_count = 0
        self.traffic = None  # logical payload of the last step's exchange
        self._agreed = False

    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    def zero_grad(self, *args, **kwargs):
        return self.optimizer.zero_grad(*args, **kwargs)

    def configuration(self):
        """What every rank must share besides the model."""
        return type(self).__name__

    def step(self, closure=None):
        if not self._agreed:
            agree(HorovodTorchCommunicator(), Layout(
                names=tuple(self.names), shapes=tuple(tuple(p.shape) for p in self.parameters),
                dtypes=tuple(str(p.dtype) for p in self.parameters)), self.configuration())
            self._agreed = True
        loss = self.local_step(closure)
        self.gossip()
        self.step_count += 1
        return loss

    def local_step(self, closure):
        return self.optimizer.step(closure)

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "step": self.step_count}

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = int(state["step"])

    # -- flat views of parameter runs ---------------------------------------
    def flatten(self, positions):
        return torch.cat([self.parameters[i].data.reshape(-1) for i in positions])

    def unflatten(self, positions, flat):
        offset = 0
        for i in positions:
            parameter = self.parameters[i]
            parameter.data.copy_(flat[offset:offset + parameter.numel()].view_as(parameter))
            offset += parameter.numel()


def _send_and_receive(comm, outgoing, incoming_sizes, like):
    """One alltoall: ``outgoing`` is ``[(destination, flat)]``, ``incoming_sizes``
    ``[(source, numel)]``; returns the received flats in ``incoming_sizes`` order."""
    splits = [0] * comm.size
    outgoing = sorted(enumerate(outgoing), key=lambda item: (item[1][0], item[0]))
    for _, (destination, flat) in outgoing:
        splits[destination] += flat.numel()
    payload = torch.cat([flat for _, (_, flat) in outgoing]) if outgoing else like.new_zeros(0)
    received, _ = comm.alltoall(payload, splits)
    offsets = {}
    start = 0
    order = sorted(range(len(incoming_sizes)), key=lambda i: (incoming_sizes[i][0], i))
    for i in order:
        offsets[i] = start
        start += incoming_sizes[i][1]
    return [received[offsets[i]:offsets[i] + size] for i, (_, size) in enumerate(incoming_sizes)]


class CrossoverSGD(_GossipOptimizer):
    """Crossover-SGD: segment-wise gossip over a fresh random derangement per segment.

    Parameters
    ----------
    optimizer : the torch optimizer each rank steps with its own gradient.
    named_parameters : optional ``model.named_parameters()``; with it the
        default segments are the top-level modules (the name before the first
        ``.``), without it one segment per parameter tensor.
    segments : ``None`` (default above); an integer: that many runs of
        consecutive parameters of nearly equal size; or a list of name patterns
        (``fnmatch``; an entry may be a list of patterns), one per segment, e.g.
        one per ResNet bottleneck for the paper's "fine" split:
        ``[f"layer{i}.{j}.*" for ...] + ["*"]`` (see ``core.gossip.named_segments``).
    groups : ``None`` (flat: every rank gossips) or ``G`` dividing ``P``:
        hierarchical mode -- ``G`` contiguous groups; gradients are averaged
        inside a group (allreduce in a Horovod process set), only the group
        leader steps and gossips with the other leaders, then sends the model to
        its group.  Needs ``hvd.init(process_sets="dynamic")``.
    seed : shared seed of the derangements (no coordination messages).
    topology : ``"uniform"`` (default: every derangement equally likely) or
        ``"paper"`` (the authors' sequential sampler, not uniform;
        ``core.gossip.roulette_derangement``).
    """

    def __init__(self, optimizer, named_parameters=None, segments=None, groups=None, seed=0,
                 topology="uniform"):
        named_parameters = list(named_parameters) if named_parameters is not None else None
        super().__init__(optimizer, named_parameters)
        self.seed = check_integer("seed", seed, minimum=0)
        self.topology = check_choice("topology", topology, TOPOLOGIES)
        self.segments = self._plan(segments, named_parameters is not None)
        size, rank = hvd.size(), hvd.rank()
        self.groups = hierarchical_groups(size, size if groups is None else groups)
        self.leaders = [group[0] for group in self.groups]
        self.world = HorovodTorchCommunicator()
        self.is_leader = rank in self.leaders
        # hierarchical: the group's gradient allreduce runs in a Horovod process set
        self.group_set = None if len(self.groups) == size else _group_process_set(self.groups)

    def configuration(self):
        return (f"CrossoverSGD(segments={self.segments}, groups={len(self.groups)}, "
                f"seed={self.seed}, topology={self.topology!r})")

    def _plan(self, segments, named):
        sizes = [p.numel() for p in self.parameters]
        if isinstance(segments, (list, tuple)):
            if not named:
                raise ValueError("segments by name need named_parameters")
            return named_segments(self.names, segments)
        if segments is not None:
            return balanced_segments(sizes, segments)
        if not named:
            return [[i] for i in range(len(sizes))]
        module = [name.split(".")[0] for name in self.names]
        return [[i for i, _ in run] for _, run in itertools.groupby(enumerate(module),
                                                                    key=lambda item: item[1])]

    def local_step(self, closure):
        if self.group_set is None:
            return self.optimizer.step(closure)
        with_grad = [i for i, p in enumerate(self.parameters) if p.grad is not None]
        grads = torch.cat([self.parameters[i].grad.reshape(-1) for i in with_grad])
        mean = hvd.allreduce(grads, op=hvd.Average, name="crossover.group_gradients",
                             process_set=self.group_set)  # one allreduce inside the group
        offset = 0
        for i in with_grad:
            grad = self.parameters[i].grad
            grad.copy_(mean[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()
        return self.optimizer.step(closure) if self.is_leader else None  # members get the model

    def gossip(self):
        """Leaders mix with their derangement peers; every rank takes part in the
        same global alltoalls (non-leaders with empty splits), so every rank issues
        the same Horovod operations each step (Horovod names unnamed operations by
        a per-process counter: unequal counts would hang a later unnamed call)."""
        self.world.reset_traffic()
        if len(self.leaders) >= 2:
            self._mix_leaders()
        if self.group_set is not None:
            self._broadcast_from_leaders()
        self.traffic = self.world.traffic.totals()

    def _mix_leaders(self):
        owns = [self.flatten(positions) for positions in self.segments]
        if not self.is_leader:
            _send_and_receive(self.world, [], [], owns[0])
            return
        send_to, receive_from = crossover_routes(self.seed, self.step_count, len(self.segments),
                                                 len(self.leaders),
                                                 self.leaders.index(self.world.rank),
                                                 self.topology)
        received = _send_and_receive(self.world,
                             [(self.leaders[j], own) for j, own in zip(send_to, owns)],
                             [(self.leaders[j], own.numel()) for j, own in zip(receive_from, owns)],
                             owns[0])
        for positions, own, other in zip(self.segments, owns, received):
            self.unflatten(positions, own.mul_(0.5).add_(other.mul(0.5)))

    def _broadcast_from_leaders(self):
        """Every leader sends its model to its group, all groups in one global
        alltoall: each step then ends with a collective of all ranks, so no group
        runs ahead and a rank that finishes cannot cut off another group's
        broadcast in flight (Horovod shuts every set down with the first rank)."""
        everything = list(range(len(self.parameters)))
        model = self.flatten(everything)
        group = self.group_set.ranks
        if self.is_leader:
            _send_and_receive(self.world, [(member, model) for member in group[1:]], [], model)
        else:
            received, = _send_and_receive(self.world, [], [(group[0], model.numel())], model)
            self.unflatten(everything, received)


class SGP(_GossipOptimizer):
    """SGP baseline: average with the peers at distances ``3^i`` and ``2*3^i``
    (``i = t mod (floor(log3(P-1)) + 1)``; ``schedule="two_peer"``, default, as
    the Crossover-SGD authors ran it) or, ``schedule="one_peer"``, with one peer
    of the official code's exponential graph (``core.gossip.sgp_one_peer_offsets``);
    the whole model, one alltoall a step."""

    def __init__(self, optimizer, named_parameters=None, schedule="two_peer"):
        super().__init__(optimizer, list(named_parameters) if named_parameters else None)
        self.schedule = check_choice("schedule", schedule, SGP_SCHEDULES)
        self.members = HorovodTorchCommunicator()

    def configuration(self):
        return f"SGP(schedule={self.schedule!r})"

    def gossip(self):
        comm = self.members
        if comm.size < 2:
            return
        comm.reset_traffic()
        positions = list(range(len(self.parameters)))
        own = self.flatten(positions)
        distances = sgp_peer_distances(self.step_count, comm.size, self.schedule)
        received = _send_and_receive(comm, [((comm.rank + d) % comm.size, own) for d in distances],
                             [((comm.rank - d) % comm.size, own.numel()) for d in distances], own)
        total = own.clone()
        for other in received:
            total.add_(other)
        self.unflatten(positions, total.div_(len(distances) + 1))
        self.traffic = comm.traffic.totals()


_REGISTERED = {}  # ranks -> Horovod process set, registered once per process


def _group_process_set(groups):
    """This rank's group as a Horovod process set (every rank registers every
    group, in the same order, as Horovod requires, once per process; one group is
    the global set)."""
    if len(groups) == 1:
        return hvd.global_process_set
    for ranks in groups:
        if tuple(ranks) not in _REGISTERED:
            try:
                _REGISTERED[tuple(ranks)] = hvd.add_process_set(ranks)
            except (ValueError, RuntimeError) as error:
                raise ValueError("hierarchical Crossover-SGD registers Horovod process sets: "
                                 "call hvd.init(process_sets=\"dynamic\") first "
                                 f"({error})") from error
    return next(_REGISTERED[tuple(ranks)] for ranks in groups if hvd.rank() in ranks)


__all__ = ["CrossoverSGD", "SGP"]
