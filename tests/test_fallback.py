"""``fallback="auto"`` (``core.fallback``) on simulated ranks.

The schedule and the decision are checked with given step times; a real run
checks that every rank takes the same decisions, and that nothing error
feedback owes is lost across switches: over any run,
``P * sum_t aggregate_t + sum_r e_r = sum_t sum_r g_r(t)`` (average reduction).
"""

import numpy as np
import pytest

from gradients import SHAPES, stream
from harness import FixedSchedule, layout_of
from horovod_sparse import create
from horovod_sparse.core import GradientExchange, Layout, NumpyOps, run_simulated
from horovod_sparse.core.errors import ConfigurationMismatchError
from horovod_sparse.core.fallback import AutoFallback, create_fallback

LAYOUT = layout_of(SHAPES)


def schedule(policy, steps, seconds, size=2):
    """The kinds ``policy`` runs on ``size`` ranks when every rank's sparse step
    takes ``seconds["sparse"]`` and a dense one ``seconds["dense"]`` (or
    ``seconds(step, kind)``)."""
    time_of = seconds if callable(seconds) else lambda step, kind: seconds[kind]
    kinds = []
    for step in range(steps):
        report = policy.begin_step(time_of(step - 1, kinds[-1]) if kinds else None)
        if report is not None:  # every rank reports the same
            policy.decide(size * report, size)
        kinds.append(policy.kind)
    return "".join("D" if kind == "dense" else "s" for kind in kinds)


def test_dense_is_chosen_where_it_is_faster_and_rechecked():
    policy = AutoFallback(probe=2, recheck_every=10, probe_cost=0.5, warmup=1)
    assert schedule(policy, 21, {"sparse": 2.0, "dense": 1.0}) == "s" + "sssDDDDDDD" * 2


def test_sparse_stays_where_it_pays():
    """A sparse first choice is confirmed by the next check, 6 steps on."""
    policy = AutoFallback(probe=2, recheck_every=10, probe_cost=0.9, warmup=1)
    assert (schedule(policy, 27, {"sparse": 1.0, "dense": 2.0})
            == "s" + "sssDDD" + "sssDDDssss" * 2)


@pytest.mark.parametrize("seconds,decided,check", [({"sparse": 3.0, "dense": 1.0}, 10, 610),
                                                   ({"sparse": 1.0, "dense": 4.0}, 60, 960),
                                                   ({"sparse": 1.0, "dense": 1.001}, 60, 260)])
def test_a_clear_loser_is_probed_within_the_probe_cost(seconds, decided, check):
    """After 10 warm-up steps, the next check is ``L = max(200, 3 |D - S| / (0.01
    min(D, S)))`` steps after the deciding one started (a sparse first choice
    is confirmed by a check 50 steps on, which then decides): probing the
    losing kind costs 1 % of the time."""
    policy = AutoFallback()
    kinds = schedule(policy, check + 6, seconds)
    if seconds["dense"] < seconds["sparse"]:
        expected = "s" * 10 + "sssDDD" + "D" * (check - 16) + "sssDDD"
    else:
        expected = "s" * 10 + ("sssDDD" + "s" * 44) + "sssDDD" + "s" * (check - 66) + "sssDDD"
    assert policy.check == check and check - decided >= 200
    assert kinds == expected


def test_one_slow_probe_step_does_not_decide():
    """A step is only ever slowed down by what else runs, so each kind counts its
    shortest period: one dense probe held up 5x still loses to nothing."""
    policy = AutoFallback(probe=2, recheck_every=10, warmup=0)
    report = None
    # (none), untimed sparse, sparse, sparse, untimed dense, dense, dense
    for seconds in [None, 9.0, 2.0, 2.1, 9.0, 5.0, 1.0]:
        report = policy.begin_step(seconds)
    np.testing.assert_array_equal(report, [1_000_000, 2_000_000])  # microseconds
    policy.decide(2 * report, 2)
    assert policy.kind == "dense"


def test_the_decision_is_the_ranks_mean():
    """Rank 0 finds dense 1 ms faster, rank 1 finds it 3 ms slower: sparse, on both
    (the first check; the other way round, dense)."""
    policy = AutoFallback(probe=1, recheck_every=5, warmup=0)
    policy.decide(np.array([0.010 + 0.013, 0.011 + 0.010]), 2)
    assert policy.choice == "sparse"
    policy = AutoFallback(probe=1, recheck_every=5, warmup=0)
    policy.decide(np.array([0.010 + 0.011, 0.013 + 0.010]), 2)
    assert policy.choice == "dense"


def test_a_later_change_of_choice_is_confirmed_first():
    """After the first check, a check that finds the other kind faster is
    confirmed 50 steps later before the choice changes: a burst of load that
    slows both timed dense steps of one check (steps 614-615) does not send the
    next 600 steps sparsely; a lasting change (sparse faster from step 600 on)
    switches after the confirming check."""
    def burst(step, kind):
        return 4.0 if kind == "dense" and 613 <= step <= 615 else {"sparse": 3.0, "dense": 1.0}[kind]

    def lasting(step, kind):
        return {"sparse": 3.0, "dense": 1.0}[kind] if step < 600 else {"sparse": 1.0,
                                                                      "dense": 3.0}[kind]
    first = "s" * 10 + "sssDDD" + "D" * 594 + "sssDDD" + "D" * 44 + "sssDDD"
    policy = AutoFallback()
    assert schedule(policy, 700, burst) == first + "D" * 34
    assert policy.choice == "dense" and policy.check == 660 + 600
    policy = AutoFallback()
    assert schedule(policy, 700, lasting) == first + "s" * 34
    assert policy.choice == "sparse" and policy.check == 660 + 600


def test_a_sparse_first_choice_is_confirmed_first():
    """Both timed dense steps of the first check held up (steps 13-15): sparse
    steps that cost 3x dense ones run only until the confirming check 50 steps
    on, which decides dense alone -- not for the 600 steps the first check's
    timings would allow."""
    def burst(step, kind):
        return 9.0 if kind == "dense" and 13 <= step <= 15 else {"sparse": 3.0, "dense": 1.0}[kind]

    policy = AutoFallback()
    assert (schedule(policy, 200, burst)
            == "s" * 10 + "sssDDD" + "s" * 44 + "sssDDD" + "D" * 134)
    assert policy.choice == "dense" and policy.check == 60 + 600


@pytest.mark.parametrize("arguments", [{"probe": 0}, {"recheck_every": 4}, {"warmup": -1},
                                       {"probe_cost": 0}, {"probe_cost": 1.5}])
def test_bad_settings_are_clear_errors(arguments):
    with pytest.raises(ValueError):
        AutoFallback(**arguments)
    with pytest.raises(ValueError, match="fallback must be one of"):
        create_fallback("always")


@pytest.mark.parametrize("method", ["topk", "exdyna", "dgc"])
def test_nothing_owed_is_lost_across_switches(method):
    size, steps = 2, 9
    grads = stream(5, steps, size)

    def worker(comm):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm,
                                    fallback="auto")
        exchange.fallback = FixedSchedule("ssDDs")
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


def whole_step(exchange, comm, flat, held=()):
    """A dense step the way the PyTorch adapter runs it, with the simulated ranks'
    allreduce standing in for Horovod's: gradient by gradient, averaged in place
    (a plain step, with nothing to add, sends the gradients themselves, and the
    exchange applies a shared velocity to each result)."""
    exchange.begin_step()
    whole = exchange.begin_whole_step(LAYOUT, held, flat)
    bounds = exchange.split(LAYOUT).output_bounds
    sent = [exchange.whole_gradient(i, flat[start:stop]) if whole else flat[start:stop].copy()
            for i, (start, stop) in enumerate(LAYOUT.bounds)]
    wire = np.zeros(LAYOUT.n, dtype=np.float32)  # in the output's order, [sparse | dense]
    for view, (low, high) in zip(sent, bounds):
        wire[low:high] = view
    averaged = comm.allreduce_sum(wire) / comm.size
    finite = True
    for i, (view, (low, high)) in enumerate(zip(sent, bounds)):
        view[:] = averaged[low:high]
        if not whole:
            finite = exchange.plain_gradient(i, view) and finite
            averaged[low:high] = view
    assert whole or finite == bool(np.isfinite(averaged).all())
    exchange.end_whole_step(None if whole else finite)
    return np.array(averaged), not whole


@pytest.mark.parametrize("method,hyperparameters,options,pattern", [
    ("exdyna", {}, {}, "ssDDDsD"), ("topk", {}, {"dense_below": 32}, "ssDDDsD"),
    ("dgc", {"variant": "paper", "nesterov": True}, {}, "ssDDDsD"),
    ("dgc", {}, {}, "ssDDD"), ("dgc", {}, {"dense_below": 32}, "ssDDD")])
def test_whole_steps_equal_dense_steps_in_the_exchange(method, hyperparameters, options,
                                                       pattern):
    """The framework's allreduce of each gradient (PyTorch's path) gives what the
    exchange's own dense step gives, and leaves the same residual and the same
    velocity (under DGC's shared velocity: the same mean over the ranks; a
    sparse step after it then selects from other per-rank velocities, so the
    pattern ends there).  The second and third D: plain steps (residual empty)."""
    size = 2
    grads = stream(9, len(pattern), size)

    def worker(comm, whole):
        exchange = GradientExchange(create(method, density=0.05, **hyperparameters), NumpyOps(),
                                    comm, fallback="auto", **options)
        exchange.fallback = FixedSchedule(pattern)
        outputs = []
        for flat in (step[comm.rank] for step in grads):
            if whole and exchange.begin_step() == "dense":
                outputs.append(whole_step(exchange, comm, flat)[0])
            else:
                outputs.append(np.array(exchange.step([flat[s:e] for s, e in LAYOUT.bounds],
                                                      LAYOUT)))
        return outputs, exchange.state_dict(LAYOUT)
    inside = run_simulated(size, lambda comm: worker(comm, False))
    framework = run_simulated(size, lambda comm: worker(comm, True))
    for (out_a, state_a), (out_b, state_b) in zip(inside, framework):
        # (a plain step under momentum rounds m U + mean(g), the whole one mean(m u_r + g_r))
        for a, b in zip(out_a, out_b):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        for name, value in state_a["residuals"].items():
            np.testing.assert_allclose(state_b["residuals"][name], value, rtol=1e-6, atol=1e-6)
    for group in ("velocities", "dense_velocities"):  # the framework's ranks share their mean
        for name in inside[0][1].get(group, {}):
            def mean(ranks):
                return np.mean([state[group][name] for _, state in ranks], axis=0)
            np.testing.assert_allclose(mean(framework), mean(inside), rtol=1e-6, atol=1e-6)


def velocity_in_output_order(exchange):
    """Every gradient's velocity (sparsified and dense part) as one vector laid out
    like the step's output."""
    state = exchange.state_dict(LAYOUT)
    saved = {**state["velocities"], **state.get("dense_velocities", {})}
    out = np.zeros(LAYOUT.n, dtype=np.float32)
    for name, (low, high) in zip(LAYOUT.names, exchange.split(LAYOUT).output_bounds):
        out[low:high] = saved[name]
    return out


@pytest.mark.parametrize("options", [{}, {"dense_below": 32}])
def test_dense_steps_under_momentum_share_the_ranks_mean_velocity(options):
    """A dense step that starts with an empty residual sends the velocities alone; every
    rank adopts their mean ``U`` (the step's output), and later dense steps send the
    gradients as they are and apply ``U = m U + mean(g)`` to the results."""
    size, pattern, momentum = 3, "sDDDDs", 0.9
    grads = stream(6, len(pattern), size)

    def worker(comm):
        exchange = GradientExchange(create("dgc", density=0.05, momentum=momentum), NumpyOps(),
                                    comm, fallback="auto", **options)
        exchange.fallback = FixedSchedule(pattern)
        steps = []
        for flat in (step[comm.rank] for step in grads):
            if exchange.begin_step() == "dense":
                output, plain = whole_step(exchange, comm, flat)
            else:
                output, plain = exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT), None
            steps.append((np.array(output), plain, velocity_in_output_order(exchange)))
        return steps, exchange.split(LAYOUT).output_bounds
    ranks, bounds = zip(*run_simulated(size, worker))
    assert [plain for _, plain, _ in ranks[0]] == [None, False, False, True, True, None]
    for t in (2, 3, 4):  # after the second dense step every rank holds U = the output
        output, _, _ = ranks[0][t]
        for rank in ranks:
            np.testing.assert_array_equal(rank[t][0], output)
            np.testing.assert_array_equal(rank[t][2], output)
    for t in (3, 4):  # U = m U + mean(g), g laid out like the output
        mean = np.mean([grads[t][r] for r in range(size)], axis=0, dtype=np.float64)
        expected = np.zeros(LAYOUT.n)
        for (low, high), (start, stop) in zip(bounds[0], LAYOUT.bounds):
            expected[low:high] = momentum * ranks[0][t - 1][0][low:high] + mean[start:stop]
        np.testing.assert_allclose(ranks[0][t][0], expected, rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(rank[5][0]).all() for rank in ranks)


def scheduled(comm, method, pattern, first, **options):
    """An exchange of ``method`` under ``FixedSchedule(pattern)``, after its first
    (sparse) step on the flat gradient ``first``."""
    exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm,
                                fallback="auto", **options)
    exchange.fallback = FixedSchedule(pattern)
    exchange.step([first[s:e] for s, e in LAYOUT.bounds], LAYOUT)
    return exchange


def whole_step_with_nan(exchange, comm, flat):
    """``(what whole_step returned or None, the error it raised or None)`` on ``flat``
    with one NaN."""
    bad = flat.copy()
    bad[3] = np.nan
    try:
        return whole_step(exchange, comm, bad), None
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return None, error


@pytest.mark.parametrize("policy", ["raise", "skip", "propagate"])
def test_a_non_finite_whole_step_leaves_the_state_as_it_was(policy):
    grads = stream(4, 3, 2)

    def worker(comm):
        exchange = scheduled(comm, "topk", "sD", grads[0][comm.rank], nonfinite=policy)
        before = exchange.state_dict(LAYOUT)
        _, raised = whole_step_with_nan(exchange, comm, grads[1][comm.rank])
        return before, exchange.state_dict(LAYOUT), raised, exchange.step_count
    for before, after, raised, steps in run_simulated(2, worker):
        assert (type(raised).__name__ == "NonFiniteGradientError") == (policy == "raise")
        assert steps == (1 if policy == "raise" else 2)
        for name, value in before["residuals"].items():
            np.testing.assert_array_equal(after["residuals"][name], value)


def test_a_frozen_gradient_delays_the_shared_velocity():
    """A gradient held in the first dense step keeps its residual there, so the second
    does not adopt the mean velocity (it would carry that residual on in ``U``):
    the third does, and the fourth goes plain."""
    grads = stream(7, 5, 2)

    def worker(comm):
        exchange = scheduled(comm, "dgc", "sDDDDD", grads[0][comm.rank])
        return [whole_step(exchange, comm, grads[t][comm.rank], held=(0,) if t == 1 else ())[1]
                for t in range(1, 5)]
    for plain in run_simulated(2, worker):
        assert plain == [False, False, False, True]


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_a_non_finite_plain_step_under_momentum_keeps_the_velocity(policy):
    grads = stream(4, 4, 2)

    def worker(comm):
        exchange = scheduled(comm, "dgc", "sDDD", grads[0][comm.rank], nonfinite=policy)
        for t in (1, 2):
            whole_step(exchange, comm, grads[t][comm.rank])
        before = velocity_in_output_order(exchange)
        returned, raised = whole_step_with_nan(exchange, comm, grads[3][comm.rank])
        return before, velocity_in_output_order(exchange), returned, raised
    for before, after, returned, raised in run_simulated(2, worker):
        if policy == "raise":
            assert type(raised).__name__ == "NonFiniteGradientError"
        else:
            assert raised is None and returned[1]  # a plain step
        np.testing.assert_array_equal(after, before)


def test_plain_steps_only_where_every_gradient_travels_in_its_own_dtype():
    """A plain step hands Horovod the gradients as they are: not for bfloat16 (Horovod
    cannot sum it on CPU) or a model mixing float16 with float32 (the wire is float32)."""
    mixed = Layout(names=LAYOUT.names, shapes=LAYOUT.shapes,
                   dtypes=("float16",) + LAYOUT.dtypes[1:])
    bfloat16 = Layout(names=LAYOUT.names, shapes=LAYOUT.shapes,
                      dtypes=("torch.bfloat16",) * len(LAYOUT.names))

    def worker(comm):
        exchange = GradientExchange(create("topk", density=0.05), NumpyOps(), comm,
                                    fallback="auto")
        exchange.fallback = FixedSchedule("D")
        whole_step(exchange, comm, stream(4, 1, comm.size)[0][comm.rank])  # flushes
        refused = [exchange.begin_plain_step(layout) for layout in (mixed, bfloat16)]
        return refused, exchange.begin_plain_step(LAYOUT)
    for refused, plain in run_simulated(2, worker):
        assert refused == [False, False] and plain is True
