"""Rank program (horovodrun -np 2): the scripts Horovod users write, with and
without horovod_sparse.  ``python torch_user_scripts.py <scenario> <out>``; every
rank reports ``checks``: ``{name: true | message}`` (``records.report``).

No script names its parameters for the compressor: ``compression=`` is the only
change to a dense Horovod script.  "Same as dense" is bit for bit: at density 1
with two ranks every method's average equals Horovod's (``a/2 + b/2 == (a+b)/2``).
"""

import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import horovod.torch as hvd

import horovod_sparse.torch as hs

from horovod_sparse.core import (ConfigurationMismatchError, ModelMismatchError,
                                 NonFiniteGradientError, ParameterDivergenceError)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import FixedSchedule  # noqa: E402
from records import report  # noqa: E402


def check(condition, message):
    return True if condition else message


def digest(model):
    """Every rank's parameters, flattened, gathered: ``(P, n)``."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hvd.allgather(flat[None])


def same_on_all_ranks(model):
    gathered = digest(model)
    return bool((gathered == gathered[0]).all())


def raised_everywhere(error_type, action):
    """Run ``action``; the name of what it raised, or ``None``."""
    try:
        action()
    except error_type as error:
        return type(error).__name__, str(error)
    return None, ""


# -- 1. a mixture of experts without names -----------------------------------------
class MixtureOfExperts(torch.nn.Module):
    """Three experts of one shape; which ones get tokens depends on the data."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(6, 5)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(5, 5) for _ in range(3))
        self.head = torch.nn.Linear(5, 1)

    def forward(self, x, expert_of):
        hidden = torch.relu(self.trunk(x))
        mixed = torch.zeros_like(hidden)
        for e, expert in enumerate(self.experts):
            tokens = expert_of == e
            if tokens.any():
                mixed[tokens] = expert(hidden[tokens])
        return self.head(mixed).sum()


def train_experts(compression, steps=6, momentum=0.0):
    torch.manual_seed(0)
    model = MixtureOfExperts()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05,
                                                         momentum=momentum),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        generator = torch.Generator().manual_seed(100 * step + hvd.rank())
        x = torch.randn(12, 6, generator=generator)
        expert_of = torch.randint(0, 3, (12,), generator=generator)
        if hvd.rank() == 1:  # this rank's batch skips one expert, a different one each step
            expert_of[expert_of == step % 3] = (step + 1) % 3
        optimizer.zero_grad()
        model(x, expert_of).backward()
        optimizer.step()
    return model


def experts():
    dense = digest(train_experts(hvd.Compression.none))
    checks = {}
    for method in ("topk", "randomk", "deft"):  # density 1 sends everything: dense's average
        sparse = digest(train_experts(hs.Compression.create(method, density=1.0)))
        checks[f"{method}_d1_equals_dense"] = check(torch.equal(sparse, dense),
                                                     f"{method}: differs from dense")
    for method, density in (("exdyna", 1.0), ("exdyna", 0.3), ("topk", 0.3)):
        try:  # the guard compares every rank's parameters before every exchange
            model = train_experts(hs.Compression.create(method, density=density, check_every=1))
            identical = check(same_on_all_ranks(model), "ranks diverged")
        except ParameterDivergenceError as error:
            identical = str(error)
        checks[f"{method}_d{density}_ranks_identical"] = identical
    return checks


# -- 2. Horovod's op ---------------------------------------------------------------
def reduced_gradient(op, compression):
    torch.manual_seed(1)
    model = torch.nn.Linear(7, 3)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression, op=op)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(2 + hvd.rank())
    model(torch.randn(4, 7)).square().sum().backward()
    optimizer.synchronize()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def ops():
    dense = reduced_gradient(hvd.Sum, hvd.Compression.none)
    sparse = reduced_gradient(hvd.Sum, hs.Compression.topk(density=1.0))
    averaged = reduced_gradient(hvd.Average, hs.Compression.topk(density=1.0))
    name, message = raised_everywhere(
        ValueError, lambda: reduced_gradient(hvd.Adasum, hs.Compression.exdyna(density=0.5)))
    return {"sum_equals_dense": check(torch.equal(sparse, dense), "op=hvd.Sum differs"),
            "average_is_sum_over_P": check(torch.equal(averaged * hvd.size(), dense),
                                           "Average != Sum / P"),
            "adasum_raises": check(name == "ValueError" and "hvd.Adasum" in message, message)}


# -- 3. checkpoints the usual way --------------------------------------------------
def small_run(steps=3):
    torch.manual_seed(3)
    model = torch.nn.Linear(9, 4)
    compression = hs.Compression.exdyna(density=0.25)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        torch.manual_seed(10 * step + hvd.rank())
        optimizer.zero_grad()
        model(torch.randn(5, 9)).sum().backward()
        optimizer.step()
    return model, compression


def checkpoints():
    _, compression = small_run()
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "checkpoint.pt"), root_rank=0)
    if hvd.rank() == 0:  # the usual Horovod pattern: rank 0 saves its own state_dict()
        torch.save({"compression": compression.state_dict()}, path)
    hvd.allreduce(torch.zeros(1), name="saved")  # a barrier
    _, fresh = small_run(steps=0)
    name, message = raised_everywhere(
        ValueError, lambda: fresh.load_state_dict(torch.load(path, weights_only=False)["compression"]))
    expected = None if hvd.rank() == 0 else "ValueError"
    checks = {"own_state_elsewhere_raises": check(
        name == expected and (expected is None or "state_dict(all_ranks=True)" in message),
        f"rank {hvd.rank()}: {name} {message}")}
    gathered = compression.state_dict(all_ranks=True)  # every rank: fine
    checks["gathered_loads_everywhere"] = check(
        raised_everywhere(ValueError, lambda: fresh.load_state_dict(gathered))[0] is None,
        "gathered state refused")
    if hvd.rank() == 0:  # collective on one rank only: a clear error, not a hang
        name, message = raised_everywhere(
            TimeoutError, lambda: compression.state_dict(all_ranks=True, timeout=3.0))
        checks["one_rank_gather_times_out"] = check(
            name == "TimeoutError" and "every rank must call it" in message, message)
    else:
        time.sleep(5.0)
    return checks


# -- 4. a NaN at the first step, and a caught error ---------------------------------
def first_step_nan(method, policy):
    torch.manual_seed(4)
    model = torch.nn.Linear(16, 8)
    compression = hs.Compression.create(method, density=0.1, nonfinite=policy)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    seen = []
    for step in range(3):
        optimizer.zero_grad()
        x = torch.randn(3, 16)
        if step == 0 and hvd.rank() == 1:
            x[0, 0] = float("nan")
        model(x).sum().backward()
        try:
            optimizer.step()
            seen.append("skipped" if compression.metrics().skipped else "ok")
        except NonFiniteGradientError as error:
            seen.append(f"raised {error.ranks}")
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return seen, finite and same_on_all_ranks(model)


def nonfinite():
    checks = {}
    for method in ("micro", "exdyna", "deft", "gtopk"):
        for policy, expected in (("raise", ["raised [1]", "ok", "ok"]),
                                 ("skip", ["skipped", "ok", "ok"])):
            seen, healthy = first_step_nan(method, policy)
            checks[f"{method}_{policy}"] = check(seen == expected and healthy, f"{seen} {healthy}")
    return checks


# -- 5. mixed precision with GradScaler -------------------------------------------
def scaled_run(compression, init_scale, steps=6):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.ReLU(), torch.nn.Linear(10, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)
    scales = []
    for step in range(steps):
        torch.manual_seed(20 * step + hvd.rank())
        x = torch.randn(4, 10)
        if step == 2 and hvd.rank() == 1:
            x[0] = float("inf")  # an overflow on one rank only
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales, model


def grad_scaler():
    checks = {}
    for init_scale in (2.0 ** 10, 2.0 ** 127):
        dense_scales, _ = scaled_run(hvd.Compression.none, init_scale)
        compression = hs.Compression.exdyna(density=0.5, nonfinite="propagate")
        scales, model = scaled_run(compression, init_scale)
        checks[f"scales_as_dense_{init_scale:g}"] = check(scales == dense_scales,
                                                         f"{scales} vs dense {dense_scales}")
        # a step the scaler skipped leaves Horovod's optimizer "synchronized": the next is new
        checks[f"every_step_exchanged_{init_scale:g}"] = check(
            compression.steps_done == len(scales), f"{compression.steps_done} exchanges")
        checks[f"ranks_identical_{init_scale:g}"] = check(same_on_all_ranks(model), "diverged")
    return checks


# -- 6. mismatches that used to hang --------------------------------------------------
def mismatch_run(layers, method, density):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(layers)])
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        compression=hs.Compression.create(method, density=density))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


def mismatches():
    rank = hvd.rank()
    cases = {"extra_last_layer": (ModelMismatchError, (2 + rank, "exdyna", 0.5)),
             "topk_vs_gtopk": (ConfigurationMismatchError,
                               (2, ("topk", "gtopk")[rank], 0.5)),
             "densities": (ConfigurationMismatchError, (2, "exdyna", (0.5, 0.25)[rank]))}
    checks = {}
    for name, (error_type, arguments) in cases.items():
        raised, message = raised_everywhere(error_type, lambda: mismatch_run(*arguments))
        checks[name] = check(raised == error_type.__name__, f"{raised}: {message}")
    return checks


# -- 7. a layer frozen mid-training --------------------------------------------------
def frozen_run(compression, steps=6, freeze_at=2):
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    at_freeze = None
    for step in range(steps):
        if step == freeze_at:
            model[0].requires_grad_(False)
            at_freeze = [p.detach().clone() for p in model[0].parameters()]
        torch.manual_seed(30 * step + hvd.rank())
        optimizer.zero_grad()
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
    unmoved = all(torch.equal(p, q) for p, q in zip(model[0].parameters(), at_freeze))
    return model, unmoved


def frozen():
    checks = {}
    _, dense_unmoved = frozen_run(hvd.Compression.none)
    checks["dense_frozen_layer_unmoved"] = check(dense_unmoved, "dense moved it")
    for method in ("exdyna", "topk", "randomk"):
        compression = hs.Compression.create(method, density=0.2)
        model, unmoved = frozen_run(compression)
        residual = compression.state_dict()["residuals"]["allreduce.noname.0.0"]
        checks[f"{method}_frozen_layer_unmoved"] = check(unmoved, "the exchange moved it")
        checks[f"{method}_residual_held"] = check(bool(abs(residual).sum() > 0),
                                                  "the frozen layer's residual was dropped")
        checks[f"{method}_ranks_identical"] = check(same_on_all_ranks(model), "diverged")
    return checks


# -- 8. small tensors sent densely ---------------------------------------------------
def dense_part():
    dense = digest(train_experts(hvd.Compression.none))
    everything = hs.Compression.exdyna(density=0.1, dense_below=10 ** 9)
    checks = {"all_dense_equals_dense": check(torch.equal(digest(train_experts(everything)), dense),
                                              "dense_below above every size differs from dense")}
    # DGC keeps the velocity itself: its dense part is momentum SGD (rounding aside)
    dense_momentum = digest(train_experts(hvd.Compression.none, momentum=0.9))
    dgc = digest(train_experts(hs.Compression.dgc(density=0.1, dense_below=10 ** 9)))
    checks["dgc_dense_is_momentum_sgd"] = check(torch.allclose(dgc, dense_momentum, atol=1e-6),
                                                float((dgc - dense_momentum).abs().max()))
    compression = hs.Compression.exdyna(density=0.2, dense_1d=True)
    model = train_experts(compression)
    biases = sum(p.numel() for name, p in model.named_parameters() if name.endswith("bias"))
    metrics = compression.metrics()
    checks["biases_sent_densely"] = check(metrics.dense == biases, f"{metrics.dense} != {biases}")
    checks["density_over_the_sparsified_part"] = check(
        metrics.n + metrics.dense == sum(p.numel() for p in model.parameters()), str(metrics))
    residuals = compression.state_dict()["residuals"]
    checks["residuals_of_weights_only"] = check(len(residuals) == 5, sorted(residuals))
    checks["ranks_identical"] = check(same_on_all_ranks(model), "diverged")
    # GradScaler with an overflow on one rank: the dense part's NaN rides the same header
    dense_scales, _ = scaled_run(hvd.Compression.none, 2.0 ** 10)
    scales, model = scaled_run(hs.Compression.exdyna(density=0.5, nonfinite="propagate",
                                                     dense_1d=True), 2.0 ** 10)
    checks["grad_scaler_scales_as_dense"] = check(scales == dense_scales,
                                                  f"{scales} vs dense {dense_scales}")
    checks["grad_scaler_ranks_identical"] = check(same_on_all_ranks(model), "diverged")
    # the usual rank-0 checkpoint of a gathered state, DGC's dense velocities included
    compression = hs.Compression.dgc(density=0.1, dense_1d=True)
    train_experts(compression)
    gathered = compression.state_dict(all_ranks=True)
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(), "checkpoint.pt"), root_rank=0)
    if hvd.rank() == 0:
        torch.save({"compression": gathered}, path)
    hvd.allreduce(torch.zeros(1), name="dense_part.saved")  # a barrier
    fresh = hs.Compression.dgc(density=0.1, dense_1d=True)
    fresh.load_state_dict(torch.load(path, weights_only=False)["compression"])
    own, loaded = compression.state_dict(), fresh.state_dict()
    checks["checkpoint_keeps_dense_velocities"] = check(
        sorted(loaded["dense_velocities"]) == sorted(own["dense_velocities"]) and all(
            (loaded["dense_velocities"][k] == own["dense_velocities"][k]).all()
            for k in own["dense_velocities"]), sorted(loaded.get("dense_velocities", {})))
    return checks


# -- 9. common slips -----------------------------------------------------------------
def slips():
    checks = {}

    def uncalled_factory():
        model = torch.nn.Linear(3, 2)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             compression=hs.Compression.exdyna)
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()

    name, message = raised_everywhere(TypeError, uncalled_factory)
    checks["uncalled_factory"] = check(name == "TypeError" and "exdyna(density=" in message,
                                       message)

    model = torch.nn.Linear(3, 2)
    named = model.named_parameters()  # one generator for both
    compression = hs.Compression.exdyna(density=0.5, named_parameters=named)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=named, compression=compression)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    checks["shared_generator"] = check(
        sorted(compression.state_dict()["residuals"]) == ["bias", "weight"],
        str(sorted(compression.state_dict()["residuals"])))

    def sparse_embedding():
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             compression=hs.Compression.exdyna(density=0.5))
        model(torch.tensor([1, 2])).sum().backward()
        optimizer.step()

    name, message = raised_everywhere(TypeError, sparse_embedding)
    checks["sparse_embedding"] = check(name == "TypeError" and "sparse_as_dense" in message,
                                       message)

    def momentum_twice():
        model = torch.nn.Linear(3, 2)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            compression=hs.Compression.dgc(density=0.5))
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()

    name, message = raised_everywhere(ValueError, momentum_twice)
    checks["momentum_twice"] = check(name == "ValueError" and "twice" in message, message)

    # DGC's own optimizer moves only the weight decay with its momentum: accepted
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        hs.DGCSGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
        named_parameters=model.named_parameters(),
        compression=hs.Compression.dgc(density=0.3, variant="paper", nesterov=True))
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 6) * (hvd.rank() + 1)).square().sum().backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None], name="slips.dgcsgd")
    checks["dgcsgd_accepted"] = check(bool((gathered == gathered[0]).all()),
                                      "DGCSGD + dgc(variant='paper'): ranks differ")

    def dgcsgd_under_a_method_without_momentum():  # the gradient would get none
        model = torch.nn.Linear(3, 2)
        optimizer = hvd.DistributedOptimizer(
            hs.DGCSGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01),
            compression=hs.Compression.topk(density=0.5))
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()

    name, message = raised_everywhere(ValueError, dgcsgd_under_a_method_without_momentum)
    checks["dgcsgd_refused"] = check(name == "ValueError" and "no momentum" in message, message)

    def gossip_with_models_that_differ():  # same sizes, transposed on rank 1
        model = torch.nn.Linear(*((3, 4), (4, 3))[hvd.rank()])
        optimizer = hs.CrossoverSGD(torch.optim.SGD(model.parameters(), lr=0.1))
        model(torch.ones(1, model.in_features)).sum().backward()
        optimizer.step()

    name, message = raised_everywhere(ModelMismatchError, gossip_with_models_that_differ)
    checks["gossip_models_differ"] = check(name == "ModelMismatchError", message)
    return checks


# -- 10. the optimizer's options: sparse_as_dense, process_set, synchronize() --------
def train_embedding(compression, steps=3):
    """An ``Embedding(sparse=True)`` model under ``sparse_as_dense=True``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression, sparse_as_dense=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.tensor([step, 3 + hvd.rank(), 7])).square().sum().backward()
        optimizer.step()
    return model


def train_within(process_set, compression, steps=3):
    """Horovod's optimizer reducing within ``process_set``; a rank outside it trains alone."""
    torch.manual_seed(1)
    model = torch.nn.Linear(5, 3)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression, process_set=process_set)
    try:
        for step in range(steps):
            optimizer.zero_grad()
            model(torch.randn(4, 5, generator=torch.Generator().manual_seed(step + 10 * hvd.rank()))
                  ).square().sum().backward()
            optimizer.step()
    finally:
        hvd.barrier()  # the rank outside waits here, not in the next run's collectives
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def clipped_run(compression, skip, steps=4):
    """Horovod's clipping pattern: ``synchronize()``, clip, ``step()`` (inside
    ``skip_synchronize()`` when ``skip``, else Horovod warns and reduces again)."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 6, generator=torch.Generator().manual_seed(step + 10 * hvd.rank()))
              ).square().sum().backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if skip:
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Horovod's "can cause training slowdown"
                optimizer.step()
    return digest(model), compression


def options(rank_zero):
    dense = digest(train_embedding(hvd.Compression.none))
    sparse = digest(train_embedding(hs.Compression.topk(density=1.0)))
    checks = {"sparse_as_dense_equals_dense": check(torch.equal(sparse, dense),
                                                    "sparse_as_dense: differs from dense")}
    skipped, compression = clipped_run(hs.Compression.exdyna(density=0.3), skip=True)
    again, repeated = clipped_run(hs.Compression.exdyna(density=0.3), skip=False)
    checks["step_after_synchronize_equals_skip_synchronize"] = check(
        torch.equal(skipped, again) and repeated.steps_done == compression.steps_done == 4,
        f"differs, or {repeated.steps_done} exchanges for 4 steps")
    # last: rank 1 sits out the runs within {0}, so collectives named by count could differ
    dense = train_within(rank_zero, hvd.Compression.none)
    sparse = train_within(rank_zero, hs.Compression.exdyna(density=1.0))
    checks["optimizer_process_set_equals_dense"] = check(torch.equal(sparse, dense),
                                                         "within rank 0's set: differs")
    name, message = raised_everywhere(ValueError, lambda: train_within(
        rank_zero, hs.Compression.exdyna(density=1.0, process_set=hvd.global_process_set)))
    if hvd.rank() == 0:
        raised = name == "ValueError" and "the same process_set" in message
    else:  # outside the set: Horovod never calls the compressor, the rank trains alone
        raised = name is None
    checks["other_process_set_raises"] = check(raised, message or "nothing raised")
    return checks


# -- 11. fallback="auto": its dense steps through Horovod's own allreduce -----------
def _train_with_fallback(in_exchange, nan_at=None, steps=8, method="exdyna",
                         pattern="ssDDsD"):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    compression = hs.Compression.create(method, density=0.05, fallback="auto")
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         compression=compression)
    if in_exchange:  # what TensorFlow and locally clipped methods do
        compression._whole_step_begins = lambda: False
    flushed, raised, before, after = [], None, None, None
    for step in range(steps):
        x = torch.randn(8, 12, generator=torch.Generator().manual_seed(100 * step + hvd.rank()))
        optimizer.zero_grad()
        loss = model(x).square().mean()
        if step == nan_at:  # a dense step sends each gradient as backward makes it
            before = compression.state_dict()
            loss = loss * (float("nan") if hvd.rank() == 1 else 1.0)
        loss.backward()
        try:
            optimizer.step()
        except NonFiniteGradientError as error:
            raised, after = type(error).__name__, compression.state_dict()
        if step == 0:
            compression.gradient_exchange.fallback = FixedSchedule(pattern, step=1)
        residuals = compression.state_dict()["residuals"]
        if compression.metrics().extra.get("fallback") and step != nan_at:
            flushed.append(all(not np.any(r) for r in residuals.values()))
    return model, compression, flushed, raised, (before, after)


def fallback():
    native, compression, flushed, _, _ = _train_with_fallback(in_exchange=False)
    inside, _, flushed_inside, _, _ = _train_with_fallback(in_exchange=True)
    kinds = "".join("D" if m.extra.get("fallback") else "s" for m in compression.history)
    _, recovered, _, raised, (before, after) = _train_with_fallback(False, nan_at=2, steps=4)
    _, plain, _, raised_plain, (before_plain, after_plain) = _train_with_fallback(
        False, nan_at=3, steps=5)  # step 3: a plain dense step (nothing left to add)
    # DGC's momentum correction: from the second dense step on, one shared velocity
    # (steps 3-5 plain: Horovod allreduces the gradients, momentum applied to the results)
    dgc = {in_exchange: _train_with_fallback(in_exchange, steps=6, method="dgc", pattern="D")
           for in_exchange in (False, True)}
    dgc_kinds = "".join("D" if m.extra.get("fallback") else "s" for m in dgc[False][1].history)
    dgc_velocities = dgc[False][1].state_dict()["velocities"]
    ranks_velocities = hvd.allgather_object(dgc_velocities)
    return {
        "pattern": check(kinds == "ssDDsDss", kinds),
        "dense steps flush the residual": check(flushed and all(flushed) and all(flushed_inside),
                                                (flushed, flushed_inside)),
        "Horovod's allreduce = the exchange's dense step": check(all(
            torch.allclose(a, b, rtol=1e-5, atol=1e-6)
            for a, b in zip(native.parameters(), inside.parameters())), "parameters differ"),
        "ranks identical": check(same_on_all_ranks(native), "ranks differ"),
        "NaN in a dense step raises everywhere": check(raised == "NonFiniteGradientError", raised),
        "state kept": check(all(np.array_equal(before["residuals"][k], after["residuals"][k])
                                for k in before["residuals"]) and after["step"] == before["step"],
                            "state changed"),
        "the next step goes on": check(recovered.gradient_exchange.step_count == 3,
                                       recovered.gradient_exchange.step_count),
        "DGC: Horovod's allreduce = the exchange's dense step": check(
            dgc_kinds == "sDDDDD" and all(
                torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                for a, b in zip(dgc[False][0].parameters(), dgc[True][0].parameters())),
            dgc_kinds),
        "DGC: ranks identical, velocities too": check(
            same_on_all_ranks(dgc[False][0]) and all(
                np.array_equal(v, ranks_velocities[0][name])
                for name, v in dgc_velocities.items()), "ranks differ"),
        "NaN in a plain dense step too": check(
            raised_plain == "NonFiniteGradientError" and after_plain["step"] == before_plain["step"]
            and plain.gradient_exchange.step_count == 4, (raised_plain, after_plain["step"])),
    }


SCENARIOS = {"experts": experts, "ops": ops, "checkpoints": checkpoints, "nonfinite": nonfinite,
             "grad_scaler": grad_scaler, "mismatches": mismatches, "frozen": frozen,
             "dense_part": dense_part, "slips": slips, "fallback": fallback}


def main():
    if sys.argv[1] == "options":
        rank_zero = hvd.ProcessSet([0])
        hvd.init(process_sets=[rank_zero])
        checks = options(rank_zero)
    else:
        hvd.init()
        checks = SCENARIOS[sys.argv[1]]()
    report(sys.argv[2], hvd.rank(), checks=checks)


if __name__ == "__main__":
    main()
