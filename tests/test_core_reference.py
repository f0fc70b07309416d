"""The core, run on simulated ranks, equals the independent numpy references bit for bit."""

import pytest

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
