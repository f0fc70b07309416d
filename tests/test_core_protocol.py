"""The step protocol on simulated ranks: header first (enforced), configuration
fingerprints, non-finite policies at the first step, reductions, held gradients,
and the index width on the wire."""

import os
import re

import numpy as np
import pytest

from gradients import SHAPES, dyadic_gradient
from harness import layout_of
from horovod_sparse import available, create
from horovod_sparse.core import (ConfigurationMismatchError, GradientExchange, Layout,
                                 NonFiniteGradientError, NumpyOps, SimulatedCommunicator,
                                 run_simulated)
from horovod_sparse.core.exchange import StepContext
from horovod_sparse.core.methods.base import Sparsifier

LAYOUT = layout_of(SHAPES)


def run_steps(method, grads, options=None, exchange_options=None, held=()):
    """Every rank's ``(outputs, exchange)`` for ``grads[rank][step]``; an error a
    step raises is its output."""
    def worker(comm):
        exchange = GradientExchange(create(method, density=0.05, **(options or {})), NumpyOps(),
                                    comm, **(exchange_options or {}))
        outputs = []
        for flat in grads[comm.rank]:
            try:
                aggregate = exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT, held)
                outputs.append(np.array(aggregate))
            except (NonFiniteGradientError, ConfigurationMismatchError) as error:
                outputs.append(error)
        return outputs, exchange
    return run_simulated(len(grads), worker)


def clean_grads(size, steps):
    return [[dyadic_gradient(0, t, r) for t in range(steps)] for r in range(size)]


class RecordingCommunicator(SimulatedCommunicator):
    """Remembers the name of every collective it runs."""

    def __init__(self, rank, group, calls):
        super().__init__(rank, group)
        self.calls = calls

    def _timed(self, collective, *args):
        self.calls.append(collective.__name__)
        return super()._timed(collective, *args)


@pytest.mark.parametrize("method", available())
def test_every_method_exchanges_the_header_first(method):
    calls = {}

    def worker(comm):
        recording = RecordingCommunicator(comm.rank, comm._group, calls.setdefault(comm.rank, []))
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), recording)
        for step in range(3):
            del recording.calls[:]
            flat = dyadic_gradient(0, step, comm.rank)
            exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
            assert recording.calls[0] == "_allgather_host", (method, step, recording.calls)
        return True

    assert run_simulated(2, worker) == [True, True]


class _PayloadFirst(Sparsifier, register=False):
    name = "payload_first"

    def exchange(self, acc, context):
        context.allreduce_sum(acc)


def test_a_payload_collective_before_the_header_raises():
    def worker(comm):
        exchange = GradientExchange(_PayloadFirst(0.5), NumpyOps(), comm)
        with pytest.raises(RuntimeError, match="before the step's header"):
            exchange.step([np.ones(4, dtype=np.float32)], layout_of([(4,)]))
        return True

    assert run_simulated(2, worker) == [True, True]


@pytest.mark.parametrize("method", available())
def test_nan_at_the_first_step_follows_the_policy_on_every_rank(method):
    grads = clean_grads(3, 2)
    grads[1][0] = grads[1][0].copy()
    grads[1][0][5] = np.nan
    for outputs, exchange in run_steps(method, grads):
        assert isinstance(outputs[0], NonFiniteGradientError) and outputs[0].ranks == [1]
        assert not isinstance(outputs[1], Exception) and np.isfinite(outputs[1]).all()
    for policy, check in (("skip", lambda out: not out.any()),
                          ("propagate", lambda out: np.isnan(out).all())):
        for outputs, exchange in run_steps(method, grads, exchange_options={"nonfinite": policy}):
            assert check(outputs[0]), (method, policy)
            assert np.isfinite(outputs[1]).all() and exchange.history[0].skipped


def test_ranks_with_different_configurations_fail_on_every_rank():
    def worker(comm):
        exchange = GradientExchange(create("exdyna", density=(0.05, 0.1)[comm.rank]), NumpyOps(),
                                    comm)
        flat = dyadic_gradient(0, 0, comm.rank)
        with pytest.raises(ConfigurationMismatchError, match=r"ExDyna\(density=0\.") as raised:
            exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return raised.value.ranks

    assert run_simulated(2, worker) == [[1], [0]]


@pytest.mark.parametrize("method", available())
def test_sum_reduction_is_p_times_the_average_with_the_same_residuals(method):
    grads = clean_grads(4, 3)
    averaged = run_steps(method, grads)
    summed = run_steps(method, grads, exchange_options={"reduction": "sum"})
    for (avg_out, avg), (sum_out, total) in zip(averaged, summed):
        for a, s in zip(avg_out, sum_out):
            np.testing.assert_array_equal(s, 4 * a)
        np.testing.assert_array_equal(total.feedback.residual, avg.feedback.residual)


@pytest.mark.parametrize("method", available())
def test_held_gradients_send_nothing_and_keep_their_residuals(method):
    """A held gradient's residual (and velocity) waits unchanged and its aggregate is
    zero; the others' conservation holds around it: what the ranks take out of
    ``g + e`` is twice the aggregate (checked without momentum, which also feeds
    ``acc``; dyadic values, so the sums are exact)."""
    grads = clean_grads(2, 4)
    held_entry = 1
    start, stop = LAYOUT.bounds[held_entry]

    def worker(comm):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm)
        flat = grads[comm.rank][0]
        exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
        before = {"residual": np.array(exchange.feedback.residual[start:stop])}
        if exchange.feedback.velocity is not None:
            before["velocity"] = np.array(exchange.feedback.velocity[start:stop])
        steps = []
        for flat in grads[comm.rank][1:]:
            residual = np.array(exchange.feedback.residual)
            out = exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT, (held_entry,))
            assert not out[start:stop].any()
            gradient = flat.copy()
            gradient[start:stop] = 0  # absent this step
            steps.append((gradient + residual - exchange.feedback.residual, np.array(out)))
        np.testing.assert_array_equal(exchange.feedback.residual[start:stop], before["residual"])
        if "velocity" in before:
            np.testing.assert_array_equal(exchange.feedback.velocity[start:stop],
                                          before["velocity"])
        return steps, "velocity" in before

    (first, momentum), (second, _) = run_simulated(2, worker)
    if not momentum:
        for (taken_0, out_0), (taken_1, out_1) in zip(first, second):
            np.testing.assert_array_equal((taken_0 + taken_1) / np.float32(2), out_0)
            np.testing.assert_array_equal(out_0, out_1)


@pytest.mark.parametrize("n, wire", [(1000, np.int32), (2 ** 31 + 10, np.int64)])
def test_indices_travel_as_int32_only_when_every_position_fits(n, wire):
    layout = Layout(names=("huge",), shapes=((n,),), dtypes=("float32",))
    sent = np.array([0, n - 1], dtype=np.int64)

    def worker(comm):
        seen = []
        comm._allgather = lambda x, counts, inner=comm._allgather: seen.append(x.dtype) or inner(
            x, counts)
        context = StepContext(NumpyOps(), comm, layout, 0, "configuration", True, None)
        context.exchange_header()
        gathered = context.allgather_indices(sent, [2, 2])
        return gathered, seen

    for gathered, seen in run_simulated(2, worker):
        assert seen == [np.dtype(wire)]
        np.testing.assert_array_equal(gathered, np.concatenate([sent, sent]))
        assert gathered.dtype == np.int64


def documented_rounds():
    """``{(method, option): (first step, later steps)}`` from docs/design.md's
    rounds table; ``option`` is ``None`` or a row's ``(name, value)`` setting."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "design.md")
    with open(path) as f:
        text = f.read().split("## Collective rounds per step", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r'^\| (\w+)(?:, `(\w+)="(\w+)"`)? \| (\d+) \| (\d+) \|', text, flags=re.M)
    return {(method, (key, value) if key else None): (int(first), int(later))
            for method, key, value, first, later in rows}


def test_rounds_per_step_are_the_documented_ones():
    def worker(comm, method, option):
        options = dict([option]) if option else {}
        exchange = GradientExchange(create(method, density=0.05, **options), NumpyOps(), comm)
        rounds = []
        for step in range(3):
            flat = dyadic_gradient(0, step, comm.rank)
            exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
            rounds.append(exchange.metrics.rounds)
        return rounds[0], rounds[2]

    documented = documented_rounds()
    assert {method for method, option in documented if option is None} == set(available())
    for (method, option), rounds in documented.items():
        counted = run_simulated(4, lambda comm: worker(comm, method, option))
        assert counted == [rounds] * 4, (method, option)


@pytest.mark.parametrize("method", ["exdyna", "topk", "dgc"])
def test_the_step_timers_nest_in_the_total(method):
    """``total_time`` times the whole exchange: it holds the selection and the
    collectives (benchmarks/synthetic.py's breakdown takes the rest as local work)."""
    for _, exchange in run_steps(method, clean_grads(2, 3)):
        for metrics in exchange.history:
            assert metrics.selection_time > 0 and metrics.communication_time > 0
            assert metrics.total_time >= metrics.selection_time + metrics.communication_time


@pytest.mark.parametrize("method", ["exdyna", "topk", "dgc"])
def test_gradients_written_into_the_last_output_give_the_same_steps(method):
    """Under ``zero_grad(set_to_none=False)`` PyTorch writes the next gradient into
    ``p.grad``, a view of the last output buffer, and hands that in.  Every step
    must still equal the one given fresh copies -- also after a step that wrote
    no output (``step_count`` moved on, as a plain dense step of the fallback
    does) -- so the buffer being zeroed and written is never the one read."""
    grads = clean_grads(size=2, steps=5)
    options = {"dense_below": 300}  # a dense part too

    def worker(comm, in_place):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm, **options)
        outputs, last = [], None
        for step, flat in enumerate(grads[comm.rank]):
            if step == 2:
                exchange.step_count += 1
            split = exchange.split(LAYOUT)
            if in_place and last is not None:
                last[...] = 0  # zero_grad(set_to_none=False), then backward
                for i, (s, e) in enumerate(LAYOUT.bounds):
                    out_s, out_e = split.output_bounds[i]
                    last[out_s:out_e] += flat[s:e]
                views = [last[slice(*split.output_bounds[i])] for i in range(len(LAYOUT.bounds))]
            else:
                views = [flat[s:e].copy() for s, e in LAYOUT.bounds]
            last = exchange.step(views, LAYOUT)
            outputs.append(np.array(last))
        return outputs

    fresh = run_simulated(2, lambda comm: worker(comm, False))
    reused = run_simulated(2, lambda comm: worker(comm, True))
    for fresh_rank, reused_rank in zip(fresh, reused):
        for a, b in zip(fresh_rank, reused_rank):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("method", ["topk", "exdyna", "dgc"])
def test_a_step_raised_at_its_header_keeps_the_residual_when_gradients_alias_the_output(method):
    """``zero_grad(set_to_none=False)``: the gradients are views of the last output,
    where the next ``acc`` is formed.  A step refused at its header (a NaN under
    ``"raise"``) keeps residual and velocity exactly -- the next step equals one
    taken as if the refused step never happened -- and leaves ``acc = g + e`` in
    the views (documented in ``torch/compression.py``)."""
    layout = layout_of(SHAPES)

    def worker(comm, refuse):
        exchange = GradientExchange(create(method, density=0.05), NumpyOps(), comm)
        last = exchange.step([dyadic_gradient(0, 0, comm.rank)[s:e].copy()
                              for s, e in layout.bounds], layout)
        kept = exchange.state_dict(layout)
        if refuse:
            views = [last[s:e] for s, e in exchange.split(layout).output_bounds]
            grad = dyadic_gradient(0, 1, comm.rank)
            if comm.rank == 1:
                grad[5] = np.nan
            for view, (s, e) in zip(views, layout.bounds):
                view[...] = 0
                view += grad[s:e]
            with pytest.raises(NonFiniteGradientError):
                exchange.step(views, layout)
            if comm.rank == 0 and not exchange.feedback.momentum:
                residual = np.concatenate([kept["residuals"][name].reshape(-1)
                                           for name in layout.names])
                np.testing.assert_array_equal(np.concatenate(views), residual + grad)
            after = exchange.state_dict(layout)
            for part in kept:
                if isinstance(kept[part], dict):
                    for name in kept[part]:
                        np.testing.assert_array_equal(after[part][name], kept[part][name])
        return np.array(exchange.step([dyadic_gradient(0, 2, comm.rank)[s:e].copy()
                                       for s, e in layout.bounds], layout))

    refused = run_simulated(2, lambda comm: worker(comm, True))
    straight = run_simulated(2, lambda comm: worker(comm, False))
    for a, b in zip(refused, straight):
        np.testing.assert_array_equal(a, b)
