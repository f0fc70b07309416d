"""The compressor's state across elastic restarts (``core.elastic``), on simulated ranks.

States come from real exchanges (DGC: residuals and velocities).  The
expected values are computed here in plain numpy: the mean of the ranks'
arrays, and the pending update ``(1/P) sum_r e_r`` before and after.  The
whole path under ``horovodrun``'s elastic mode is in ``test_multihost.py``.
"""

import numpy as np
import pytest

from gradients import SHAPES, stream
from harness import layout_of
from horovod_sparse import create
from horovod_sparse.core import GradientExchange, NumpyOps, checkpoint, elastic, run_simulated

LAYOUT = layout_of(SHAPES)
STEPS = 4


def committed_states(size, seed=3):
    """Every rank's own state (stamped) after ``STEPS`` DGC steps on ``size`` ranks."""
    grads = stream(seed, STEPS, size)

    def worker(comm):
        exchange = GradientExchange(create("dgc", density=0.05), NumpyOps(), comm)
        for flat in (step[comm.rank] for step in grads):
            exchange.step([flat[s:e] for s, e in LAYOUT.bounds], LAYOUT)
        return dict(exchange.state_dict(LAYOUT), rank=comm.rank, size=size)
    return run_simulated(size, worker)


def pending(states, group="residuals"):
    """``(1/P) sum_r e_r`` by name, in float64."""
    names = states[0][group]
    return {name: np.mean([np.asarray(s[group][name], np.float64) for s in states], axis=0)
            for name in names}


def commit_everywhere(states):
    return run_simulated(len(states), lambda comm: elastic.commit(states[comm.rank], comm))


def test_average_is_the_mean_localize_carries_over():
    states = committed_states(3)
    averaged = run_simulated(3, lambda comm: checkpoint.average(states[comm.rank], comm))
    carried = checkpoint.localize({"ranks": states}, 0, 2)
    for mean in averaged:
        assert mean["step"] == STEPS and set(mean) == set(carried)
        for group in ("residuals", "velocities"):
            for name, value in carried[group].items():
                assert mean[group][name].dtype == np.float32
                np.testing.assert_allclose(mean[group][name], value, rtol=0, atol=1e-7)
    for other in averaged[1:]:  # the same bits on every rank
        for name in other["residuals"]:
            np.testing.assert_array_equal(other["residuals"][name], averaged[0]["residuals"][name])


def test_average_refuses_ranks_at_different_steps():
    states = committed_states(2)
    states[1] = dict(states[1], step=STEPS + 1)
    with pytest.raises(ValueError, match="differ"):
        run_simulated(2, lambda comm: checkpoint.average(states[comm.rank], comm))


def test_same_world_resumes_each_rank_bit_for_bit():
    states = committed_states(3)
    snapshots = commit_everywhere(states)
    resumed = run_simulated(3, lambda comm: elastic.resume(snapshots[comm.rank], comm))
    for rank, (state, snapshot) in enumerate(resumed):
        assert state is snapshots[rank].own and snapshot is snapshots[rank]
        for name, value in states[rank]["residuals"].items():
            np.testing.assert_array_equal(state["residuals"][name], value)
        assert state["sparsifier"] == states[rank]["sparsifier"]


@pytest.mark.parametrize("new_size", [2, 4], ids=["host-removed", "host-added"])
def test_another_world_starts_from_the_committed_mean(new_size):
    """3 ranks commit; 2 survive (ranks 0, 1), or a fourth joins with nothing.  Every rank
    of the new world gets the committed mean, so the pending update is unchanged."""
    states = committed_states(3)
    snapshots = commit_everywhere(states)
    joined = [elastic.local_snapshot({"rank": 3, "size": 4})]
    new_world = (snapshots + joined)[:new_size]
    resumed = run_simulated(new_size, lambda comm: elastic.resume(new_world[comm.rank], comm))
    before = {group: pending(states, group) for group in ("residuals", "velocities")}
    loaded = [state for state, _ in resumed]
    for group in ("residuals", "velocities"):
        after = pending(loaded, group)
        for name, value in before[group].items():
            np.testing.assert_allclose(after[name], value, rtol=1e-6, atol=1e-7)
    assert all(state["step"] == STEPS and "sparsifier" not in state for state in loaded)
    assert all(snapshot.own is snapshot.mean for _, snapshot in resumed)


def test_first_sync_computes_the_mean_it_did_not_have():
    states = committed_states(2)
    snapshots = [elastic.local_snapshot(state) for state in states]
    assert all(s.mean is None for s in snapshots)
    resumed = run_simulated(2, lambda comm: elastic.resume(snapshots[comm.rank], comm))
    for rank, (state, snapshot) in enumerate(resumed):
        assert state is snapshots[rank].own  # each rank keeps its own state
        for name, value in pending(states).items():
            np.testing.assert_allclose(snapshot.mean["residuals"][name], value, rtol=1e-6,
                                       atol=1e-7)


def test_rank_zero_without_a_commit_raises_on_every_rank():
    """A world where rank 0 joined after the last commit cannot carry anything over."""
    states = committed_states(2)
    snapshots = [elastic.local_snapshot({"rank": 0, "size": 2}), commit_everywhere(states)[1]]
    with pytest.raises(RuntimeError, match="rank 0 holds no committed"):
        run_simulated(2, lambda comm: elastic.resume(snapshots[comm.rank], comm))


def test_a_new_world_without_elastic_state_is_a_clear_error():
    with pytest.raises(RuntimeError, match="hvd.elastic.TorchState"):
        elastic.after_shrink(None, 0, 1)
    state = {"step": 2, "residuals": {}}
    assert elastic.after_shrink(elastic.Snapshot(state, state), 0, 1) is state


def test_broadcast_sends_rank_zeros_state_or_none():
    states = committed_states(2)
    got = run_simulated(2, lambda comm: checkpoint.broadcast(
        states[0] if comm.rank == 0 else None, comm))
    for state in got:
        for name, value in states[0]["residuals"].items():
            np.testing.assert_array_equal(state["residuals"][name], value)
    assert run_simulated(2, lambda comm: checkpoint.broadcast(None, comm)) == [None, None]
