"""``fallback="auto"`` (``core.fallback``) on simulated ranks.

The schedule and the decision are checked with given step times; a real run
checks that every rank takes the same decisions, and that nothing error
feedback owes is lost across switches: over any run,
``P * sum_t aggregate_t + sum_r e_r = sum_t sum_r g_r(t)`` (average reduction).
"""

import numpy as np
import pytest

from gradients import SHAPES, stream
from harness import layout_of
from horovod_sparse import create
from horovod_sparse.core import GradientExchange, NumpyOps, run_simulated
from horovod_sparse.core.errors import ConfigurationMismatchError
from horovod_sparse.core.fallback import AutoFallback, create_fallback

LAYOUT = layout_of(SHAPES)


def schedule(policy, steps, seconds):
    """The kinds ``policy`` runs when a sparse step takes ``seconds["sparse"]`` and a
    dense one ``seconds["dense"]`` on both of 2 ranks."""
    kinds = []
    for step in range(steps):
        kinds.append(policy.kind(step))
        if step:
            policy.observe(step - 1, [seconds[kinds[step - 1]]] * 2)
    return "".join("D" if kind == "dense" else "s" for kind in kinds)


def test_dense_is_chosen_where_it_is_faster_and_rechecked_every_cycle():
    policy = AutoFallback(probe=2, recheck_every=10, warmup=1)
    assert schedule(policy, 21, {"sparse": 2.0, "dense": 1.0}) == "s" + "ssDDsDDDDD" + "ssDDDDDDDD"


def test_sparse_stays_where_it_pays():
    policy = AutoFallback(probe=2, recheck_every=10, warmup=1)
    assert schedule(policy, 21, {"sparse": 1.0, "dense": 5.0}) == "s" + "ssDDssssss" * 2


@pytest.mark.parametrize("arguments", [{"probe": 0}, {"recheck_every": 5}, {"warmup": -1}])
def test_bad_settings_are_clear_errors(arguments):
    with pytest.raises(ValueError):
        AutoFallback(**arguments)
    with pytest.raises(ValueError, match="fallback must be one of"):
        create_fallback("always")


class Alternating(AutoFallback):
    """Sparse and dense steps in a fixed pattern (the switch itself is under test)."""

    def __init__(self, pattern):
        super().__init__()
        self.pattern = pattern

    def kind(self, step):
        return "dense" if self.pattern[step % len(self.pattern)] == "D" else "sparse"


@pytest.mark.parametrize("method", ["topk", "exdyna", "dgc"])
def test_nothing_owed_is_lost_across_switches(method):
    size, steps = 2, 9
    grads = stream(5, steps, size)

    def worker(comm):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm,
                                    fallback="auto")
        exchange.fallback = Alternating("ssDDs")
        total = np.zeros(LAYOUT.n)
        for flat in (step[comm.rank] for step in grads):
            total += exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
            if exchange.metrics.extra.get("fallback"):
                assert np.count_nonzero(exchange.feedback.residual) == 0  # flushed
        return total, np.array(exchange.feedback.residual, dtype=np.float64), exchange
    results = run_simulated(size, worker)
    sent = size * results[0][0]
    owed = sum(residual for _, residual, _ in results)
    if method == "dgc":  # momentum correction: what was sent is the velocities' sum
        return _check_dgc_dense_steps(results)
    np.testing.assert_allclose(sent + owed, sum(sum(step) for step in grads), rtol=1e-5,
                               atol=1e-5)


def _check_dgc_dense_steps(results):
    kinds = [bool(m.extra.get("fallback")) for m in results[0][2].history]
    assert kinds == [False, False, True, True, False, False, False, True, True]
    assert all(np.isfinite(total).all() for total, _, _ in results)


def test_every_rank_takes_the_same_decisions_from_real_timings():
    size, steps = 3, 30
    grads = stream(2, steps, size)

    def worker(comm):
        exchange = GradientExchange(create("exdyna", density=0.05), NumpyOps(), comm,
                                    fallback="auto")
        exchange.fallback = AutoFallback(probe=2, recheck_every=8, warmup=1)
        for flat in (step[comm.rank] for step in grads):
            exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return "".join("D" if m.extra.get("fallback") else "s" for m in exchange.history)
    kinds = run_simulated(size, worker)
    assert len(set(kinds)) == 1 and "D" in kinds[0], kinds


def test_ranks_must_agree_on_the_fallback():
    def worker(comm):
        exchange = GradientExchange(create("topk", density=0.05), NumpyOps(), comm,
                                    fallback="auto" if comm.rank else None)
        flat = np.ones(LAYOUT.n, dtype=np.float32)
        exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
    with pytest.raises(ConfigurationMismatchError):
        run_simulated(2, worker)
