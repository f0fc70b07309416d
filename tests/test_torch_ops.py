"""TorchOps against NumpyOps (the reference semantics) on random CPU tensors, one process.

The Horovod tests check whole exchanges under ``horovodrun``; these pin the
per-element operations themselves, including the CPU scan's numpy fast path
(chunk boundaries, values exactly at the threshold, float16) and the torch
path it falls back to for bfloat16.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from horovod_sparse.core.kernels import SCAN_CHUNK  # noqa: E402
from horovod_sparse.core.ops import NumpyOps  # noqa: E402
from horovod_sparse.torch.ops import TorchOps  # noqa: E402

NUMPY, TORCH = NumpyOps(), TorchOps()


def heavy_tailed(n, seed, dtype=np.float32):
    values = np.random.default_rng(seed).standard_t(3, n).astype(dtype)
    values[::97] = values[5]  # many ties, some exactly at any threshold taken from the data
    return values


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("start,stop", [(0, 3 * SCAN_CHUNK + 17), (SCAN_CHUNK - 5, 2 * SCAN_CHUNK + 3),
                                        (10, 10), (7, 300)])
def test_abs_ge_indices_matches_numpy(dtype, start, stop):
    x = heavy_tailed(3 * SCAN_CHUNK + 40, seed=start + stop, dtype=dtype)
    threshold = float(abs(x[5]))
    expected = np.flatnonzero(np.abs(x[start:stop]) >= x.dtype.type(threshold)) + start
    assert np.array_equal(NUMPY.abs_ge_indices(x, threshold, start, stop), expected)
    found = TORCH.abs_ge_indices(torch.from_numpy(x), threshold, start, stop)
    assert found.dtype == torch.int64
    assert np.array_equal(found.numpy(), expected)
    indices, values = TORCH.abs_ge_entries(torch.from_numpy(x), threshold, start, stop)
    assert np.array_equal(indices.numpy(), expected)
    assert np.array_equal(values.numpy(), x[expected])


def test_bfloat16_uses_the_torch_scan_and_counts():
    x = torch.from_numpy(heavy_tailed(TorchOps.chunk + 100, seed=3)).to(torch.bfloat16)
    threshold = float(x[5].abs())
    expected = torch.nonzero(x.abs() >= threshold).squeeze(1)
    assert torch.equal(TORCH.abs_ge_indices(x, threshold, 3, len(x)), expected[expected >= 3])
    indices, values = TORCH.abs_ge_entries(x, threshold, 3, len(x))
    assert torch.equal(indices, expected[expected >= 3]) and torch.equal(values, x[indices])
    rungs = np.sort(x[:40].abs().float().numpy()).astype(np.float64)
    expected_counts = [int((x.abs() >= torch.tensor(r, dtype=torch.bfloat16)).sum()) for r in rungs]
    assert TORCH.count_abs_ge_each(x, rungs).tolist() == expected_counts


@pytest.mark.parametrize("k", [0, 1, 50, 999, 5000])
def test_topk_ties_and_counts_match_numpy(k):
    x = heavy_tailed(5000, seed=k)
    tensor = torch.from_numpy(x)
    assert np.array_equal(TORCH.topk_abs_indices(tensor, k, 100, 4000).numpy(),
                          NUMPY.topk_abs_indices(x, k, 100, 4000))
    rungs = np.sort(np.abs(x[:40])).astype(np.float64)
    assert np.array_equal(TORCH.count_abs_ge_each(tensor, rungs), NUMPY.count_abs_ge_each(x, rungs))


def test_merge_sum_and_norms_match_numpy():
    rng = np.random.default_rng(1)
    a, b = np.unique(rng.integers(0, 1000, 300)), np.unique(rng.integers(0, 1000, 300))
    va, vb = rng.standard_normal(a.size).astype(np.float32), rng.standard_normal(b.size).astype(np.float32)
    merged, sums = TORCH.merge_sum(*map(torch.from_numpy, (a, va, b, vb)))
    expected_merged, expected_sums = NUMPY.merge_sum(a, va, b, vb)
    assert np.array_equal(merged.numpy(), expected_merged)
    assert np.array_equal(sums.numpy(), expected_sums)
    x = heavy_tailed(10_000, seed=2)
    bounds = [(0, 10), (10, 4000), (4000, 10_000)]
    assert np.allclose(TORCH.segment_sq_norms(torch.from_numpy(x), bounds),
                       NUMPY.segment_sq_norms(x, bounds), rtol=1e-12)


def test_segment_sq_norms_off_the_compiled_path_go_a_chunk_at_a_time():
    x = heavy_tailed(10_000, seed=3)
    bounds = [(0, 10), (10, 10), (10, 4000), (4000, 10_000)]
    chunked = TorchOps()
    chunked.chunk = 1000  # several chunks per segment
    half = torch.from_numpy(x).to(torch.bfloat16)  # no numpy view: torch's path
    assert np.allclose(chunked.segment_sq_norms(half, bounds),
                       NUMPY.segment_sq_norms(half.float().numpy(), bounds), rtol=1e-12)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6])
def test_median_rows_matches_numpy(count):
    rows = [heavy_tailed(1000, seed=10 + r) for r in range(count)]
    rows[0][:50] = rows[-1][:50]  # ties across rows
    assert np.array_equal(TORCH.median_rows([torch.from_numpy(r) for r in rows]).numpy(),
                          NUMPY.median_rows(rows))


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_accumulate_slice_matches_numpy(grad_dtype, momentum):
    """The compiled path (float32) and torch's (bfloat16) both form acc and move the
    velocity over ``[start, stop)`` only."""
    rng = np.random.default_rng(6)
    n, start, stop = 5000, 1000, 3500
    residual, old = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    grad = torch.from_numpy(rng.standard_normal(stop - start).astype(np.float32)).to(grad_dtype)
    results = []
    for ops, wrap in ((NUMPY, np.array), (TORCH, torch.from_numpy)):
        acc, new = (wrap(np.full(n, 7.0, np.float32)) for _ in range(2))
        velocity = (new, wrap(old.copy())) if momentum else None
        g = grad.float().numpy() if ops is NUMPY else grad
        ops.accumulate_slice(acc, wrap(residual.copy()), g, start, stop, None, velocity,
                             momentum, False)
        results.append([np.asarray(t) for t in (acc, new)])
    for numpy_result, torch_result in zip(*results):
        assert np.array_equal(numpy_result, torch_result)
    acc, _ = results[1]
    assert (acc[:start] == 7).all() and (acc[stop:] == 7).all() and (acc[start:stop] != 7).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_momentum_slice_matches_the_two_step_reference(dtype):
    """``out = m velocity + result`` (two roundings), then ``result = out``: through
    numpy on CPU float32 tensors, through torch for bfloat16, the same bits; and
    whether the result is finite."""
    velocity, result = (torch.from_numpy(heavy_tailed(300, seed)).to(dtype) for seed in (1, 2))
    expected_out = np.zeros(300, np.float32)
    NUMPY.scale_add_slice(expected_out, velocity.float().numpy(), 0.9,
                          result[100:250].float().numpy(), 100, 250)
    out, got = torch.zeros(300, dtype=dtype), result[100:250].clone()
    assert TORCH.momentum_slice(out, velocity, 0.9, got, 100, 250) is True
    if dtype == torch.float32:
        assert np.array_equal(out.numpy(), expected_out)
        assert np.array_equal(got.numpy(), expected_out[100:250])
    else:  # torch's own arithmetic in bfloat16
        assert torch.equal(got, out[100:250]) and torch.count_nonzero(out[:100]) == 0
    bad = result[100:250].clone()
    bad[7] = float("inf")  # the result's finiteness, checked on the way
    assert TORCH.momentum_slice(torch.zeros_like(out), velocity, 0.9, bad, 100, 250) is False
