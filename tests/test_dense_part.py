"""Small gradients sent densely (``dense_below``, ``dense_1d``) on simulated ranks.

The sparsified part must equal the numpy reference run on those gradients
alone, bit for bit; the dense part must be the exact average of the ranks'
gradients (under momentum correction: of their velocities ``u = m u + g``).
"""

import numpy as np
import pytest

import reference
from gradients import SHAPES, sizes, stream
from harness import CASES, SIMULATED_ONLY, layout_of
from horovod_sparse import create
from horovod_sparse.core import (GradientExchange, Layout, NonFiniteGradientError, NumpyOps,
                                 checkpoint, run_simulated)
from horovod_sparse.core.dense_part import Split, dense_positions
from horovod_sparse.core.errors import ConfigurationMismatchError

LAYOUT = layout_of(SHAPES)
DENSE_BELOW = 32  # SHAPES' (30,), (20,), (1,) and (3, 5) go dense
DENSE, SPARSE = (1, 3, 5, 6), (0, 2, 4)


def pick(flat, positions, bounds=LAYOUT.bounds):
    return np.concatenate([flat[bounds[i][0]:bounds[i][1]] for i in positions])


def run(method, options, grads, density=0.05, held=(), **split):
    """Every rank's ``(aggregates, exchange)`` after ``grads``."""
    def worker(comm):
        exchange = GradientExchange(create(method, density=density, **options), NumpyOps(),
                                    comm, **split)
        aggregates = []
        for flat in (step[comm.rank] for step in grads):
            aggregates.append(np.array(exchange.step(
                [None if i in held else flat[s:e] for i, (s, e) in enumerate(LAYOUT.bounds)],
                LAYOUT, held)))
        return aggregates, exchange
    return run_simulated(len(grads[0]), worker)


def dense_reference(grads, momentum, nesterov=False):
    """The rank-order sum of each rank's dense gradients (or velocities ``u``; Nesterov
    ``m u + g``) over ``P``, per step."""
    size = len(grads[0])
    velocities = [np.zeros(sum(sizes()[i] for i in DENSE), np.float32) for _ in range(size)]
    expected = []
    for step in grads:
        sent = []
        for rank, flat in enumerate(step):
            g = pick(flat, DENSE)
            if momentum:
                velocities[rank] = np.float32(momentum) * velocities[rank] + g
                g = np.float32(momentum) * velocities[rank] + g if nesterov else velocities[rank]
            sent.append(g)
        total = sent[0].copy()
        for g in sent[1:]:
            total = total + g
        expected.append(total / np.float32(size))
    return expected


def test_dense_positions():
    assert dense_positions(LAYOUT, DENSE_BELOW) == DENSE
    assert dense_positions(LAYOUT, dense_1d=True) == (1, 3, 5)
    assert dense_positions(LAYOUT) == ()
    split = Split(LAYOUT, DENSE)
    assert split.sparse == SPARSE and split.sparse_layout.n + split.dense_layout.n == LAYOUT.n
    # output: [sparsified part | dense part], each in layout order
    assert split.output_bounds[0] == (0, 1200) and split.output_bounds[2] == (1200, 1800)
    assert split.output_bounds[1] == (2376, 2406) and split.output_bounds[6] == (2427, 2442)


@pytest.mark.parametrize("method,options", [c for c in CASES + SIMULATED_ONLY
                                            if "clip_norm" not in c[1]
                                            and c[1].get("variant") != "paper"])
def test_sparse_part_is_the_reference_and_dense_part_the_exact_average(method, options):
    grads = stream(seed=5, steps=6, size=3)
    results = run(method, options, grads, dense_below=DENSE_BELOW)
    expected = reference.run(method, [[pick(g, SPARSE) for g in step] for step in grads], 0.05,
                             [SHAPES[i] for i in SPARSE], **options)
    sparsifier = create(method, **options)
    dense = dense_reference(grads, sparsifier.momentum, sparsifier.nesterov)
    bounds = Split(LAYOUT, DENSE).output_bounds
    for rank, (aggregates, exchange) in enumerate(results):
        for step, aggregate in enumerate(aggregates):
            where = f"{method} {options} rank {rank} step {step}"
            np.testing.assert_array_equal(pick(aggregate, SPARSE, bounds),
                                          expected[step]["aggregate"], err_msg=where)
            np.testing.assert_array_equal(pick(aggregate, DENSE, bounds), dense[step],
                                          err_msg=where)
        np.testing.assert_array_equal(exchange.feedback.residual,
                                      expected[-1]["residuals"][rank])
        metrics = exchange.metrics
        assert metrics.n == sum(sizes()[i] for i in SPARSE) and metrics.dense == 66
        assert metrics.overall_density == (metrics.nnz + 66) / LAYOUT.n


def test_one_more_round_and_density_over_the_sparsified_part():
    grads = stream(seed=6, steps=3, size=2)
    (_, split), _ = run("exdyna", {}, grads, dense_1d=True)
    (_, whole), _ = run("exdyna", {}, grads)
    for with_dense, without in zip(split.history, whole.history):
        assert with_dense.rounds == without.rounds + 1
        assert with_dense.dense == 51 and with_dense.n == LAYOUT.n - 51
        assert with_dense.k == create("exdyna", density=0.05).k(LAYOUT.n - 51)


def test_every_gradient_dense_is_the_exact_average():
    grads = stream(seed=7, steps=3, size=3)
    for (aggregates, exchange) in run("topk", {}, grads, dense_below=10 ** 6):
        for step, aggregate in enumerate(aggregates):
            total = grads[step][0] + grads[step][1] + grads[step][2]
            np.testing.assert_array_equal(aggregate, total / np.float32(3))
        assert exchange.metrics.n == 0 and exchange.metrics.rounds == 2  # header, allreduce


def test_held_dense_gradient_is_zero_and_keeps_its_velocity():
    grads = stream(seed=8, steps=3, size=2)
    split = Split(LAYOUT, DENSE)
    start, stop = split.output_bounds[1]

    def worker(comm):
        exchange = GradientExchange(create("dgc", density=0.05), NumpyOps(), comm,
                                    dense_below=DENSE_BELOW)
        velocities, outputs = [], []
        for step, held in enumerate([(), (), (1,)]):
            flat = grads[step][comm.rank]
            outputs.append(np.array(exchange.step(
                [None if i in held else flat[s:e] for i, (s, e) in enumerate(LAYOUT.bounds)],
                LAYOUT, held)))
            velocities.append(exchange.dense.state_dict(split.dense_layout)["dense_velocities"])
        return outputs, velocities
    for outputs, velocities in run_simulated(2, worker):
        assert outputs[1][start:stop].any() and not outputs[2][start:stop].any()
        np.testing.assert_array_equal(velocities[2]["p1"], velocities[1]["p1"])  # kept
        assert not np.array_equal(velocities[2]["p3"], velocities[1]["p3"])  # others moved on


def test_ranks_configured_differently_fail_everywhere():
    grads = stream(seed=9, steps=1, size=2)

    def worker(comm):
        exchange = GradientExchange(create("exdyna", density=0.05), NumpyOps(), comm,
                                    dense_below=(None, DENSE_BELOW)[comm.rank])
        with pytest.raises(ConfigurationMismatchError):
            exchange.step([grads[0][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return True
    assert run_simulated(2, worker) == [True, True]


@pytest.mark.parametrize("method", ["exdyna", "dgc"])
def test_nonfinite_dense_gradient_raises_everywhere_and_loses_nothing(method):
    grads = stream(seed=10, steps=3, size=2)
    grads[2][1] = grads[2][1].copy()
    grads[2][1][LAYOUT.bounds[3][0]] = np.nan  # in a dense gradient

    def worker(comm):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm,
                                    dense_below=DENSE_BELOW)
        for step in range(2):
            exchange.step([grads[step][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        state = exchange.state_dict(LAYOUT)
        with pytest.raises(NonFiniteGradientError):
            exchange.step([grads[2][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return state, exchange.state_dict(LAYOUT)
    for before, after in run_simulated(2, worker):
        for key in before:
            if key.endswith("residuals") or key.endswith("velocities"):
                for name in before[key]:
                    np.testing.assert_array_equal(before[key][name], after[key][name])
        assert after["step"] == before["step"] == 2


def test_resume_from_a_checkpoint_equals_the_straight_run():
    grads = stream(seed=12, steps=6, size=2)

    def worker(comm):
        def make():
            return GradientExchange(create("dgc", density=0.05), NumpyOps(), comm,
                                    dense_below=DENSE_BELOW)

        def steps(exchange, span):
            return [np.array(exchange.step([grads[t][comm.rank][s:e] for s, e in LAYOUT.bounds],
                                           LAYOUT)) for t in span]
        straight = steps(make(), range(6))
        first = make()
        steps(first, range(3))
        state = first.state_dict(LAYOUT)
        resumed = make()
        resumed.load_state_dict(state)
        return straight[3:], steps(resumed, range(3, 6)), state
    for straight, resumed, state in run_simulated(2, worker):
        assert set(state["residuals"]) == {"p0", "p2", "p4"}
        assert set(state["dense_velocities"]) == {"p1", "p3", "p5", "p6"}
        for a, b in zip(straight, resumed):
            np.testing.assert_array_equal(a, b)


def test_gathered_checkpoint_with_dense_velocities_resumes_on_fewer_ranks():
    grads = stream(seed=14, steps=3, size=2)

    def worker(comm):
        exchange = GradientExchange(create("dgc", density=0.05), NumpyOps(), comm,
                                    dense_1d=True)
        for step in range(3):
            exchange.step([grads[step][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return checkpoint.gather(exchange.state_dict(LAYOUT), comm)
    gathered = run_simulated(2, worker)[0]
    restored = checkpoint.decode(checkpoint.encode(gathered))
    for rank in range(2):
        for name, value in gathered["ranks"][rank]["dense_velocities"].items():
            np.testing.assert_array_equal(restored["ranks"][rank]["dense_velocities"][name], value)
    one = checkpoint.localize(restored, 0, 1)  # one rank: the mean of the two velocities
    np.testing.assert_array_equal(
        one["dense_velocities"]["p1"],
        np.mean([gathered["ranks"][r]["dense_velocities"]["p1"] for r in range(2)], axis=0,
                dtype=np.float64).astype(np.float32))


@pytest.mark.parametrize("saved,loaded", [({}, {"dense_below": DENSE_BELOW}),
                                          ({"dense_1d": True}, {})])
def test_state_of_the_other_part_is_refused(saved, loaded):
    """Residuals saved for a gradient now sent densely, or dense velocities for a
    model without a dense part: a KeyError, never a silent drop."""
    grads = stream(seed=15, steps=2, size=2)

    def worker(comm):
        before = GradientExchange(create("dgc", density=0.05), NumpyOps(), comm, **saved)
        before.step([grads[0][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        after = GradientExchange(create("dgc", density=0.05), NumpyOps(), comm, **loaded)
        after.load_state_dict(before.state_dict(LAYOUT))
        with pytest.raises(KeyError, match="dense_below / dense_1d / dgc's variant differ"):
            after.step([grads[1][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return True
    assert run_simulated(2, worker) == [True, True]


def test_state_dict_before_the_first_step_is_what_was_loaded():
    exchange = GradientExchange(create("dgc"), NumpyOps(), None, dense_1d=True)
    exchange.load_state_dict({"step": 4, "residuals": {"p0": np.ones(3, np.float32)},
                              "dense_velocities": {"p1": np.ones(2, np.float32)}})
    state = exchange.state_dict(None)
    assert state["step"] == 4 and set(state["residuals"]) == {"p0"}
    assert set(state["dense_velocities"]) == {"p1"}


def test_float16_gradients_give_a_float32_aggregate():
    layout = LAYOUT.subset(range(len(SHAPES)))
    half = Layout(names=layout.names, shapes=layout.shapes, dtypes=("float16",) * len(SHAPES))
    grads = stream(seed=16, steps=1, size=2)

    def worker(comm):
        exchange = GradientExchange(create("topk", density=0.05), NumpyOps(), comm,
                                    dense_1d=True)
        flat = grads[0][comm.rank].astype(np.float16)
        return exchange.step([flat[s:e] for s, e in half.bounds], half)
    for aggregate in run_simulated(2, worker):
        assert aggregate.dtype == np.float32


def test_residuals_of_a_gradient_now_sent_densely_are_refused():
    grads = stream(seed=13, steps=2, size=2)

    def worker(comm):
        plain = GradientExchange(create("exdyna", density=0.05), NumpyOps(), comm)
        plain.step([grads[0][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        split = GradientExchange(create("exdyna", density=0.05), NumpyOps(), comm,
                                 dense_below=DENSE_BELOW)
        split.load_state_dict(plain.state_dict(LAYOUT))
        with pytest.raises(KeyError, match="not sparsified here"):
            split.step([grads[1][comm.rank][s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return True
    assert run_simulated(2, worker) == [True, True]


@pytest.mark.parametrize("options,error", [({"dense_below": 0}, ValueError),
                                           ({"dense_below": 2.5}, TypeError),
                                           ({"dense_1d": "yes"}, TypeError)])
def test_bad_arguments(options, error):
    with pytest.raises(error):
        GradientExchange(create("topk"), NumpyOps(), None, **options)
