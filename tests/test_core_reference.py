"""The core, run on simulated ranks, equals the independent numpy references bit for bit."""

import numpy as np
import pytest

import reference
from gradients import stream
from harness import CASES, PARTITION_CASES, SIMULATED_ONLY, assert_matches_reference, run_core


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("method,options", CASES + SIMULATED_ONLY)
def test_matches_reference_over_20_steps(method, options, size):
    grads = stream(seed=7, steps=20, size=size)
    assert_matches_reference(method, options, run_core(method, options, grads, 0.02), grads, 0.02)


@pytest.mark.parametrize("method,options", PARTITION_CASES)  # where rebalancing matters
def test_skewed_stream_matches_reference(method, options):
    grads = stream(seed=3, steps=20, size=4, skew=True)
    assert_matches_reference(method, options, run_core(method, options, grads, 0.05), grads, 0.05)


GSSGD_TREE = {"momentum": 0.5, "merge": "tree", "rows": 5}


@pytest.mark.parametrize("size", [2, 4])
def test_gssgd_tree_merge_matches_reference(size):
    grads = stream(seed=7, steps=20, size=size)
    assert_matches_reference("gssgd", GSSGD_TREE, run_core("gssgd", GSSGD_TREE, grads, 0.02),
                             grads, 0.02)


def test_gssgd_tree_merge_refuses_three_ranks_before_any_collective():
    with pytest.raises(ValueError, match="power-of-two number of ranks"):
        run_core("gssgd", GSSGD_TREE, stream(seed=7, steps=1, size=3), 0.02)


PAPER_MODES = [("micro", {"threshold_control": "paper", "initial_threshold": "paper"}),
               ("exdyna", {"threshold_control": "paper", "rebalance": "paper",
                           "initial_threshold": "paper", "blocks": 16})]


@pytest.mark.parametrize("method,options", PAPER_MODES)
def test_paper_mode_rank_that_selects_nothing_sends_one_coordinate(method, options):
    """The released code's rule, checked where it bites: half the model silent."""
    grads = stream(seed=5, steps=12, size=4)
    for step in grads:
        for flat in step:
            flat[flat.size // 2:] = 0
    expected = assert_matches_reference(method, options, run_core(method, options, grads, 0.05),
                                        grads, 0.05)
    assert any(1 in record["counts"] for record in expected)


@pytest.mark.parametrize("method,options", PAPER_MODES)
def test_padded_allgather_delivers_the_same_and_sends_the_longest_list(method, options):
    grads = stream(seed=3, steps=8, size=4, skew=True)
    traffic = {}
    for allgather in ("exact", "padded"):
        per_rank = run_core(method, {**options, "allgather": allgather}, grads, 0.05)
        assert_matches_reference(method, options, per_rank, grads, 0.05)
        traffic[allgather] = [(r["counts"], r["elements_received"]) for r in per_rank[0]]
    for (counts, exact), (_, padded) in zip(traffic["exact"], traffic["padded"]):
        # rank 0 receives everybody else's list, padded to the longest
        assert padded - exact == (len(counts) - 1) * max(counts) - (sum(counts) - counts[0])


def test_nesterov_is_the_released_form_in_exact_arithmetic():
    """The core keeps ``u`` with ``acc = v + m u + g``; the released DGC memory keeps
    ``mmt = m (mmt + g)`` and ``v = v + mmt + g``.  On dyadic gradients with
    ``m = 1/2`` (every operation exact for these steps) the two agree bit for bit,
    with ``mmt = m u``, while the residual is never cleared."""
    grads = stream(seed=11, steps=6, size=3)
    m = 0.5
    velocities = momentums = [np.zeros_like(g) for g in grads[0]]
    ours = released = [np.zeros_like(g) for g in grads[0]]
    for step in grads:
        velocities, ours = reference.nesterov_accumulate(velocities, ours, step, m)
        momentums, released = reference.released_nesterov_accumulate(momentums, released, step, m)
        for u, mmt, a, b in zip(velocities, momentums, ours, released):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(np.float32(m) * u, mmt)
