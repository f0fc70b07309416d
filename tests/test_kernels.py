"""The compiled kernels and the sampled top-k against plain numpy references, one process.

Each reference is the obvious expression (``np.flatnonzero``, a lexicographic
sort by magnitude then index, the numpy arithmetic of error feedback); the
kernels must return exactly the same indices and bits, on the block and chunk
boundaries, ties at the threshold and at the ``k``-th magnitude, and a sample
that misses (the retry path).
"""

import math

import numpy as np
import pytest

from horovod_sparse.core import kernels
from horovod_sparse.core.ops import SAMPLE, NumpyOps, exact_topk_abs, topk_abs


def reference_abs_ge(x, threshold, start, stop):
    return np.flatnonzero(np.abs(x[start:stop]) >= x.dtype.type(threshold)) + start


def reference_topk(x, k, start, stop):
    """The k largest magnitudes, ties toward the lower index, by a full sort."""
    positions = np.arange(start, stop)
    order = np.lexsort((positions, -np.abs(x[start:stop]).astype(np.float64)))
    return np.sort(positions[order[:max(k, 0)]])


def tie_heavy(n, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "integers":  # every magnitude shared by ~n/20 elements
        return rng.integers(-20, 21, n).astype(np.float32)
    if kind == "zeros":     # half exact zeros, a heavy tail
        x = (rng.standard_normal(n) * rng.random(n) ** 4).astype(np.float32)
        x[rng.random(n) < 0.5] = 0
        return x
    x = rng.standard_cauchy(n).astype(np.float32)
    x[::97] = x[5]
    return x


def test_numba_is_used():
    assert kernels.numba is not None, "numba is a requirement (pip install numba)"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("start,stop", [(0, 64), (0, 63), (5, 5), (3, 200_003), (70, 4096 * 64 + 129)])
def test_abs_ge_entries_match_flatnonzero(dtype, start, stop):
    x = np.clip(tie_heavy(300_000, seed=start + stop, kind="cauchy"), -6e4, 6e4).astype(dtype)
    threshold = float(abs(x[5]))  # exactly equal to every 97th element
    expected = reference_abs_ge(x, threshold, start, stop)
    for indices, values in (kernels.abs_ge_entries(x, threshold, start, stop),
                            kernels._numpy_abs_ge_entries(x, threshold, start, stop)):
        assert indices.dtype == np.int64 and values.dtype == x.dtype
        assert np.array_equal(indices, expected)
        assert np.array_equal(values.view(np.uint8), x[expected].view(np.uint8))
    assert np.array_equal(kernels.abs_ge_indices(x, threshold, start, stop), expected)


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("expected", [0, 100_000, 10 ** 7])
def test_abs_ge_entries_when_many_elements_pass(share, expected):
    """Hits in most blocks of several chunks: the output grows chunk by chunk from
    the default size, from a hint too small, or never (a hint larger than the range)."""
    x = tie_heavy(3 * 4096 * 64 + 1001, seed=1, kind="cauchy")
    threshold = np.quantile(np.abs(x), 1 - share) if share else 0.0
    indices, values = kernels.abs_ge_entries(x, threshold, 11, x.size - 5, expected)
    assert np.array_equal(indices, reference_abs_ge(x, threshold, 11, x.size - 5))
    assert np.array_equal(values, x[indices])


def test_abs_ge_entries_of_nonfinite_elements():
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -2.0] * 30, np.float32)
    indices, values = kernels.abs_ge_entries(x, 1.5, 0, x.size)
    assert np.array_equal(indices, reference_abs_ge(x, 1.5, 0, x.size))  # NaN compares false
    assert np.array_equal(values, x[indices])


@pytest.mark.parametrize("kind", ["integers", "zeros", "cauchy"])
@pytest.mark.parametrize("seed", range(4))
def test_sampled_topk_equals_the_exact_selection(kind, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4 * SAMPLE, 12 * SAMPLE))
    x = tie_heavy(n, seed, kind)
    start, stop = int(rng.integers(0, 999)), n - int(rng.integers(0, 999))
    for k in (1, 7, int(rng.integers(10, (stop - start) // 16))):
        expected = reference_topk(x, k, start, stop)
        assert np.array_equal(exact_topk_abs(x, k, start, stop), expected)
        assert np.array_equal(topk_abs(x, k, start, stop), expected)


def test_sampled_topk_retries_when_the_sample_misses():
    # Every sampled position holds a huge value, so the sample's estimate of the
    # k-th magnitude is far too high: the first scan finds fewer than k
    # candidates and the lower estimates (or the full selection) must take over.
    n = 8 * SAMPLE
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
    x[::n // SAMPLE] = 100.0  # exactly the sampled positions
    k = 3 * SAMPLE
    assert np.array_equal(topk_abs(x, k, 0, n), reference_topk(x, k, 0, n))


@pytest.mark.parametrize("k", [0, 1, 100, 5000, 10_000])
def test_small_ranges_and_extreme_k(k):
    x = tie_heavy(5000, seed=k, kind="integers")
    assert np.array_equal(NumpyOps().topk_abs_indices(x, k, 100, 4000),
                          reference_topk(x, min(k, 3900), 100, 4000))


@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
@pytest.mark.parametrize("scale", [None, 0.37])
def test_accumulate_is_the_numpy_expression_bit_for_bit(momentum, nesterov, scale):
    rng = np.random.default_rng(3)
    n = 10_001
    grad, residual, old = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    g = grad if scale is None else grad * np.float32(scale)
    if momentum:
        expected_velocity = old * np.float32(momentum) + g
        sent = expected_velocity * np.float32(momentum) + g if nesterov else expected_velocity
        expected = residual + sent
    else:
        expected = residual + g
    acc, new = np.full(n + 6, np.nan, np.float32), np.full(n + 6, np.nan, np.float32)
    velocity = (new, np.concatenate([old[:3], old, old[:3]])) if momentum else None
    padded = np.concatenate([residual[:3], residual, residual[:3]])
    finite = NumpyOps().accumulate_slice(acc, padded, grad, 3, n + 3, scale, velocity, momentum,
                                         nesterov)
    assert finite is True
    assert np.array_equal(acc[3:n + 3].view(np.int32), expected.view(np.int32))
    assert np.isnan(acc[:3]).all() and np.isnan(acc[n + 3:]).all()  # nothing outside the slice
    if momentum:
        assert np.array_equal(new[3:n + 3].view(np.int32), expected_velocity.view(np.int32))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["grad", "residual"])
def test_accumulate_reports_a_nonfinite_result(bad, where):
    grad, residual = np.ones(1000, np.float32), np.ones(1000, np.float32)
    (grad if where == "grad" else residual)[999] = bad
    acc = np.empty(1000, np.float32)
    assert kernels.accumulate(acc, residual, grad) is False
    assert kernels._numpy_accumulate(acc, residual, grad, 1.0, None, None, 0.0) is False
    big = np.full(1000, 3e38, np.float32)  # finite inputs whose sum overflows
    assert kernels.accumulate(acc, big, big) is False
    velocity = (np.empty(1000, np.float32), np.zeros(1000, np.float32))
    assert kernels.accumulate(acc, residual, grad, 1.0, *velocity, 0.9) is False


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, "overflow"])
def test_momentum_result_is_the_two_numpy_operations(dtype, bad):
    """``out = m u + r`` rounded twice (no fused multiply-add), ``r = out``, and the
    finiteness of the result -- compiled for float32, numpy for float16."""
    rng = np.random.default_rng(3)
    velocity = (rng.standard_cauchy(1001) * 1e-3).astype(dtype)
    result = rng.standard_normal(1001).astype(dtype)
    if bad == "overflow":  # finite inputs whose momentum step overflows
        velocity[500] = result[500] = np.finfo(dtype).max
    elif bad is not None:
        result[500] = bad
    velocity[7] = result[7] = -0.0  # kept: the result is a copy of out, not out + 0
    out = np.zeros(1001, dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = velocity * dtype(0.9)
        expected += result
        finite = kernels.momentum_result(out, velocity, 0.9, result)
    assert finite is (bad is None)
    bits, exact = {np.float32: np.uint32, np.float16: np.uint16}[dtype], np.isfinite(expected)
    for got in (out, result):
        assert np.array_equal(got, expected, equal_nan=True)
        assert np.array_equal(got.view(bits)[exact], expected.view(bits)[exact])  # signs of zero


CHUNK = kernels.SCAN_CHUNK_BLOCKS * kernels.BLOCK  # elements accumulate_scan writes, then scans


@pytest.mark.parametrize("lo,hi", [(10, 11), (0, 200_003), (64, CHUNK + 64), (5, 3 * CHUNK + 1001),
                                   (CHUNK - 1, 2 * CHUNK + 7)])
@pytest.mark.parametrize("scale", [1.0, 0.375])
@pytest.mark.parametrize("expected", [0, 10 ** 6])
def test_accumulate_scan_is_accumulate_then_abs_ge_entries(lo, hi, scale, expected):
    """Within one gradient's slice ``[3, 200_003)`` of a longer ``acc``, the scan
    over any sub-range (chunk-aligned or not, one or several chunks)."""
    rng = np.random.default_rng(lo + hi)
    residual = tie_heavy(200_010, seed=lo, kind="cauchy")
    grad = tie_heavy(200_000, seed=hi, kind="cauchy")
    lo, hi = max(lo, 3), min(hi, 200_003)
    threshold = float(np.quantile(np.abs(residual), 0.9))
    want = np.full(200_010, rng.standard_normal(), np.float32)
    want[3:200_003] = residual[3:200_003] + grad * np.float32(scale)
    acc = np.full(200_010, want[0], np.float32)
    finite, indices, values = kernels.accumulate_scan(acc, residual, grad, scale, 3, 200_003,
                                                      lo, hi, threshold, expected)
    assert finite is True and np.array_equal(acc, want)
    assert np.array_equal(indices, reference_abs_ge(want, threshold, lo, hi))
    assert np.array_equal(values, want[indices])


def test_accumulate_scan_of_a_gradient_in_acc_itself_and_nonfinite():
    residual = tie_heavy(3 * CHUNK, seed=3, kind="cauchy")
    acc = tie_heavy(3 * CHUNK, seed=4, kind="cauchy")
    want = residual + acc
    acc[CHUNK + 5] = np.inf
    finite, indices, values = kernels.accumulate_scan(acc, residual, acc, 1.0, 0, acc.size,
                                                      100, 2 * CHUNK, 1.0)
    assert finite is False
    want[CHUNK + 5] = np.inf
    assert np.array_equal(acc, want)
    assert np.array_equal(indices, reference_abs_ge(want, 1.0, 100, 2 * CHUNK))


STREAMED = kernels.STREAM_MIN_BYTES // 4 + 1001  # float32s: a slice written with streaming stores
HEADS = [0, 1, kernels.LINE_FLOATS - 1]  # elements before a slice's first whole line


def placed(outer, head):
    """The index in the float32 vector ``outer`` from which ``head`` elements come
    before the first whole line (an aligned start for 0)."""
    first_line = (-outer.ctypes.data) % kernels.LINE // 4
    return (first_line - head) % kernels.LINE_FLOATS


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("scale", [1.0, 0.37])
@pytest.mark.parametrize("bad", [None, "head", "line", "tail", "overflow"])
def test_streamed_accumulate_is_the_numpy_expression_bit_for_bit(head, scale, bad):
    """A slice large enough for streaming stores, with any number of elements
    before its first whole line (a scalar head and tail around the vector
    lines): the same bits as numpy, nothing written outside the slice, and a
    nonfinite result found wherever it is."""
    rng = np.random.default_rng(head)
    residual = rng.standard_normal(STREAMED).astype(np.float32)
    grad = rng.standard_cauchy(STREAMED).astype(np.float32)
    where = {"head": 0, "line": STREAMED // 2, "tail": STREAMED - 2, "overflow": 999}.get(bad)
    if bad == "overflow":  # finite inputs whose sum overflows
        residual[where] = grad[where] = np.finfo(np.float32).max
        scale = 1.0
    elif bad is not None:
        grad[where] = np.nan
    with np.errstate(over="ignore", invalid="ignore"):
        want = residual + grad * np.float32(scale)
    outer = np.full(STREAMED + 2 * kernels.LINE_FLOATS, -2.5, np.float32)
    offset = placed(outer, head)
    acc = outer[offset:offset + STREAMED]
    assert kernels._streamed(acc, residual, grad)
    assert kernels.accumulate(acc, residual, grad, scale) is (bad is None)
    assert np.array_equal(acc.view(np.int32), want.view(np.int32))
    assert (outer[:offset] == -2.5).all() and (outer[offset + STREAMED:] == -2.5).all()


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("head,velocity_shift", [(0, 0), (5, 0), (5, 3)])
@pytest.mark.parametrize("bad", [None, "head", "line", "tail"])
@pytest.mark.parametrize("in_acc", [False, True])
def test_streamed_momentum_correction_is_the_numpy_expression(nesterov, head, velocity_shift,
                                                              bad, in_acc):
    """Momentum correction over a streamed slice: ``acc`` and the new velocity
    bit for bit as the numpy expressions, from any alignment; a velocity that
    starts elsewhere within a line than ``acc`` (``velocity_shift``) takes the
    loop through the cache, with the same bits; the gradient may be ``acc``."""
    rng = np.random.default_rng(head + velocity_shift)
    residual, grad, old = (rng.standard_normal(STREAMED).astype(np.float32) for _ in range(3))
    if bad is not None:
        grad[{"head": 1, "line": STREAMED // 2, "tail": STREAMED - 1}[bad]] = np.inf
    scale, momentum = np.float32(0.37), np.float32(0.9)
    with np.errstate(invalid="ignore"):
        scaled = grad * scale
        velocity = old * momentum + scaled
        want = residual + (velocity * momentum + scaled if nesterov else velocity)
    outer = np.full(2 * STREAMED + 64, -2.5, np.float32)  # acc, a gap, the new velocity
    offset = placed(outer, head)
    start = offset + STREAMED + 16
    start += (offset + velocity_shift - start) % kernels.LINE_FLOATS  # placed within a line
    acc, new = outer[offset:offset + STREAMED], outer[start:start + STREAMED]
    if in_acc:
        acc[:] = grad
        grad = acc
    streamed = kernels._streamed(acc, residual, grad, new, old)
    assert streamed is (velocity_shift == 0)
    finite = kernels.accumulate(acc, residual, grad, scale, new, old, momentum, nesterov)
    assert finite is (bad is None)
    assert np.array_equal(acc.view(np.int32), want.view(np.int32))
    assert np.array_equal(new.view(np.int32), velocity.view(np.int32))
    assert (outer[:offset] == -2.5).all() and (outer[offset + STREAMED:start] == -2.5).all()
    assert (outer[start + STREAMED:] == -2.5).all()


def test_streamed_momentum_correction_in_one_velocity_buffer():
    """``velocity_new`` may be ``velocity_old`` (each element read before written)."""
    rng = np.random.default_rng(9)
    residual, grad = (rng.standard_normal(STREAMED).astype(np.float32) for _ in range(2))
    outer = np.empty(2 * STREAMED + 2 * kernels.LINE_FLOATS, np.float32)
    gap = -STREAMED % kernels.LINE_FLOATS  # the velocity starts where acc does within a line
    acc, velocity = outer[:STREAMED], outer[STREAMED + gap:2 * STREAMED + gap]
    velocity[:] = rng.standard_normal(STREAMED)
    want_velocity = velocity * np.float32(0.9) + grad
    assert kernels._streamed(acc, residual, grad, velocity, velocity)
    assert kernels.accumulate(acc, residual, grad, 1.0, velocity, velocity, 0.9) is True
    assert np.array_equal(velocity, want_velocity)
    assert np.array_equal(acc, residual + want_velocity)


SCAN_START, SCAN_STOP = 3, STREAMED + 3  # the gradient's slice of acc in the scan tests


@pytest.mark.parametrize("lo,hi", [(5, STREAMED - 5), (1000, 1017), (4096, 2 * STREAMED // 3),
                                   (STREAMED // 2, STREAMED // 2 + 5), (3, STREAMED + 3)])
@pytest.mark.parametrize("in_acc", [False, True])
@pytest.mark.parametrize("bad", ["inf before", "inf inside", "inf after", "nan inside"])
def test_streamed_accumulate_scan_is_accumulate_then_abs_ge_entries(lo, hi, in_acc, bad):
    """The streamed scan over sub-ranges that start and stop anywhere in a line
    (or inside one), with the gradient in a separate buffer or in ``acc``
    itself, tie-heavy values (many exactly at the threshold), one nonfinite
    value (an infinity before, inside or after the range, or a NaN inside,
    which is never a hit) found wherever it is, and more hits than the output
    was sized for (it grows)."""
    residual = tie_heavy(STREAMED + 10, seed=lo, kind="integers")
    grad = tie_heavy(STREAMED, seed=hi, kind="integers")
    value, at = bad.split()
    where = {"before": SCAN_START + 1, "inside": (lo + hi) // 2, "after": SCAN_STOP - 1}[at]
    if at == "before" and lo == SCAN_START or at == "after" and hi == SCAN_STOP:
        where = lo  # no room outside the range: at its first element
    grad[where - SCAN_START] = float(value)
    want = np.full(STREAMED + 10, 0.5, np.float32)
    want[SCAN_START:SCAN_STOP] = residual[SCAN_START:SCAN_STOP] + grad
    acc = np.full(STREAMED + 10, 0.5, np.float32)
    if in_acc:
        acc[SCAN_START:SCAN_STOP] = grad
        grad = acc[SCAN_START:SCAN_STOP]
    assert kernels._streamed(acc[SCAN_START:SCAN_STOP], residual, grad)
    finite, indices, values = kernels.accumulate_scan(acc, residual, grad, 1.0, SCAN_START,
                                                      SCAN_STOP, lo, hi, 17.0, expected=10)
    assert finite is False and np.array_equal(acc, want, equal_nan=True)
    assert np.array_equal(indices, reference_abs_ge(want, 17.0, lo, hi))
    assert np.array_equal(values, want[indices])


def test_streamed_scan_of_finite_values_is_finite():
    residual = tie_heavy(STREAMED, seed=1, kind="cauchy")
    grad = tie_heavy(STREAMED, seed=2, kind="cauchy")
    acc = np.empty(STREAMED, np.float32)
    finite, indices, _ = kernels.accumulate_scan(acc, residual, grad, 1.0, 0, STREAMED, 7, 9999,
                                                 2.0)
    assert finite is True and np.array_equal(acc, residual + grad)
    assert np.array_equal(indices, reference_abs_ge(acc, 2.0, 7, 9999))


@pytest.mark.parametrize("odd", ["misaligned", "float64 residual", "float64 velocity"])
def test_streaming_falls_back_for_vectors_it_cannot_read_by_lines(odd):
    """A float32 vector at an address that is not a multiple of 4, or a float64
    residual or velocity, takes the loop through the cache: same results."""
    rng = np.random.default_rng(4)
    grad, residual, old = (rng.standard_normal(STREAMED).astype(np.float32) for _ in range(3))
    raw = np.zeros(4 * STREAMED + 65, np.uint8)
    acc = raw[1:1 + 4 * STREAMED].view(np.float32) if odd == "misaligned" else (
        np.empty(STREAMED, np.float32))
    new = velocity = None
    if odd == "float64 residual":
        residual = residual.astype(np.float64)
    if odd == "float64 velocity":
        old, new = old.astype(np.float64), np.empty(STREAMED, np.float64)
        velocity = (new, old)
    assert not kernels._streamed(acc, residual, grad, new, old if new is not None else None)
    finite = kernels.accumulate(acc, residual, grad, 1.0, *(velocity or ()),
                                *((0.9,) if velocity else ()))
    assert finite is True
    sent = old * 0.9 + grad if velocity else grad
    assert np.allclose(acc, residual + sent, rtol=1e-6, atol=1e-6)


def test_accumulate_of_the_largest_float_is_finite():
    largest = np.full(1000, np.finfo(np.float32).max, np.float32)
    acc, zeros = np.empty(1000, np.float32), np.zeros(1000, np.float32)
    assert kernels.accumulate(acc, zeros, largest) is True
    assert kernels.accumulate(acc, zeros, largest, 1.0, np.empty(1000, np.float32), zeros,
                              0.9) is True


def test_accumulate_of_a_float16_gradient_falls_back_to_numpy():
    grad = np.linspace(-2, 2, 999).astype(np.float16)
    residual = np.linspace(0, 1, 999).astype(np.float32)
    acc = np.empty(999, np.float32)
    assert kernels.accumulate(acc, residual, grad) is True
    assert np.array_equal(acc, residual + grad)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf, "largest"])
def test_all_finite_is_isfinite_all(dtype, bad):
    x = np.random.default_rng(0).standard_normal(1000).astype(dtype)
    if bad == "largest":
        x[-1] = np.finfo(dtype).max  # finite: the exponent is not all ones
    elif bad is not None:
        x[417] = bad
    assert kernels.all_finite(x) == bool(np.isfinite(x).all())
    assert kernels.all_finite(x.reshape(10, 100)) == bool(np.isfinite(x).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("offset", [0, 1, 5])
@pytest.mark.parametrize("size", [0, 3, 1000, kernels.STREAM_MIN_BYTES // 2 + 17])
def test_fill_zero_zeroes_exactly_the_vector(dtype, offset, size):
    """Streamed (a vector of at least STREAM_MIN_BYTES, from any alignment: a
    head and a tail around the aligned lines) or not, and nothing around it."""
    outer = np.full(size + offset + 40, -1.5, dtype)
    kernels.fill_zero(outer[offset:offset + size])
    assert not outer[offset:offset + size].any()
    assert (outer[:offset] == -1.5).all() and (outer[offset + size:] == -1.5).all()
    strided = np.full(2 * size + 2, 3.0, dtype)
    kernels.fill_zero(strided[::2])
    assert not strided[::2].any() and (strided[1::2] == 3.0).all()


def test_abs_ge_entries_of_a_strided_vector():
    x = tie_heavy(20_000, seed=2, kind="cauchy")[::2]
    indices, values = kernels.abs_ge_entries(x, 1.0, 3, x.size - 3)
    assert np.array_equal(indices, reference_abs_ge(x, 1.0, 3, x.size - 3))
    assert np.array_equal(values, x[indices])


def reference_sq_norm_lanes(x):
    """The kernel's order spelled out: lane j sums x[i]**2 for i = j mod 8 (the tail
    in lane 0) left to right in float64, then the lanes pairwise."""
    lanes = [0.0] * kernels.LANES
    whole = len(x) - len(x) % kernels.LANES
    for i in range(whole):
        lanes[i % kernels.LANES] += float(x[i]) ** 2
    for i in range(whole, len(x)):
        lanes[0] += float(x[i]) ** 2
    while len(lanes) > 1:
        lanes = [lanes[j] + lanes[j + 1] for j in range(0, len(lanes), 2)]
    return lanes[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 1001, 70_000])
def test_sq_norm_is_the_float64_sum_of_squares(dtype, n):
    x = (np.random.default_rng(n).standard_t(3, n) * 100).astype(dtype)
    exact = math.fsum(float(v) * float(v) for v in x)
    assert kernels.sq_norm(x) == pytest.approx(exact, rel=1e-13, abs=0)
    if dtype != np.float16:  # compiled: exactly its documented order
        assert kernels.sq_norm(x) == reference_sq_norm_lanes(x)
    assert kernels.sq_norm(x[::3]) == pytest.approx(math.fsum(float(v) ** 2 for v in x[::3]),
                                                    rel=1e-13, abs=0)


def test_sq_norm_of_nonfinite_elements_is_not_finite():
    x = np.ones(100, dtype=np.float32)
    x[50] = np.inf
    assert kernels.sq_norm(x) == np.inf
    x[60] = np.nan
    assert np.isnan(kernels.sq_norm(x))


def test_vectors_and_ranges_out_of_shape_are_refused():
    """numba checks no bounds: a vector too short or a range past the end would
    read or write outside the arrays (garbage, or another array's memory), so
    the wrappers refuse them, on the compiled and the numpy path alike."""
    guarded = np.full(48, 7.0, np.float32)  # the writes may not reach past [0, 8)
    short, full = guarded[:8], np.ones(32, np.float32)
    with pytest.raises(ValueError, match="one length"):
        kernels.momentum_result(short, full, 0.5, full.copy())
    with pytest.raises(ValueError, match="one length"):
        kernels.accumulate(full.copy(), full, short)
    with pytest.raises(ValueError, match="one length"):
        kernels.accumulate(full.copy(), full, full, 1.0, short, full, 0.9)
    with pytest.raises(ValueError, match="16 elements expected"):
        kernels.accumulate_scan(full.copy(), full, short, 1.0, 0, 16, 0, 16, 1.0)
    with pytest.raises(ValueError, match="in order"):
        kernels.accumulate_scan(full.copy(), full, full[:8], 1.0, 28, 36, 28, 36, 1.0)
    with pytest.raises(ValueError, match="in order"):
        kernels.accumulate_scan(full.copy(), full, full[:8], 1.0, 8, 16, 4, 12, 1.0)
    assert np.all(guarded[8:] == 7.0)
    for start, stop in ((0, 33), (-5, 3)):
        with pytest.raises(ValueError, match="in order"):
            kernels.abs_ge_entries(full, 0.5, start, stop)
    assert kernels.abs_ge_entries(full, 0.5, 40, 40)[0].size == 0  # empty: nothing to read


def test_sketch_kernels_refuse_a_table_of_another_shape():
    coefficients = np.ones((3, 6), np.int64)
    with pytest.raises(ValueError, match="3 rows x 4 columns"):
        kernels.sketch_encode(np.ones(10, np.float32), coefficients, 4, np.zeros(11, np.float32))
    with pytest.raises(ValueError, match="3 rows x 4 columns"):
        kernels.sketch_estimate(np.zeros(11, np.float32), 0, 10, coefficients, 4)
    with pytest.raises(ValueError, match="in order"):
        kernels.sketch_estimate(np.zeros(12, np.float32), -1, 10, coefficients, 4)
