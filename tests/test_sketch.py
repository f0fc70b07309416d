"""The Count Sketch: compiled and generic paths equal a loop over the hash formulas."""

import math

import numpy as np
import pytest

from horovod_sparse.core import kernels
from horovod_sparse.core.ops import NumpyOps
from horovod_sparse.core.sketch import CountSketch, hash_coefficients, rows_for

PRIME = 2 ** 31 - 1


class GenericNumpyOps(NumpyOps):
    """NumpyOps without a host view: the sketch takes the path a CUDA tensor takes."""

    def host_view(self, x):
        return None


def loop_sketch(x, rows, columns, seed):
    """The sketch table from the formulas in Python integers, bucket sums in index order."""
    table = np.zeros((rows, columns), np.float32)
    for r, (a, b, c, d, e, f) in enumerate(hash_coefficients(seed, rows).tolist()):
        for i, value in enumerate(x):
            bucket = ((a * i + b) % PRIME) * columns // 2 ** 31
            negative = (c * i ** 3 + d * i ** 2 + e * i + f) % PRIME % 2
            table[r, bucket] = np.float32(table[r, bucket] + (-value if negative else value))
    return table.reshape(-1)


def loop_estimates(table, rows, columns, seed, start, stop):
    table = table.reshape(rows, columns)
    estimates = []
    for i in range(start, stop):
        values = sorted(
            np.float32(-table[r, ((a * i + b) % PRIME) * columns // 2 ** 31]
                       if (c * i ** 3 + d * i ** 2 + e * i + f) % PRIME % 2 else
                       table[r, ((a * i + b) % PRIME) * columns // 2 ** 31])
            for r, (a, b, c, d, e, f) in enumerate(hash_coefficients(seed, rows).tolist()))
        estimates.append(values[(rows - 1) // 2])
    return np.array(estimates, np.float32)


@pytest.mark.parametrize("rows,columns", [(1, 7), (4, 97), (5, 1000), (12, 50)])
def test_compiled_and_generic_paths_equal_the_loop(rows, columns):
    x = np.random.default_rng(rows).standard_normal(3000).astype(np.float32)
    expected = loop_sketch(x, rows, columns, seed=11)
    compiled = CountSketch(NumpyOps(), rows, columns, seed=11)
    generic = CountSketch(GenericNumpyOps(), rows, columns, seed=11)
    np.testing.assert_array_equal(compiled.encode(x, x.size), expected)
    np.testing.assert_array_equal(generic.encode(x, x.size), expected)
    want = loop_estimates(expected, rows, columns, 11, 100, 2100)
    np.testing.assert_array_equal(compiled.estimate(expected, 100, 2100), want)
    np.testing.assert_array_equal(generic.estimate(expected, 100, 2100), want)


def test_torch_cpu_and_device_paths_equal_numpy():
    torch = pytest.importorskip("torch")
    from horovod_sparse.torch.ops import TorchOps

    class DeviceTorchOps(TorchOps):  # the path a CUDA tensor takes, run on CPU
        def host_view(self, x):
            return None

    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    expected = CountSketch(NumpyOps(), 5, 300, seed=2).encode(x, x.size)
    for ops in (TorchOps(), DeviceTorchOps()):
        sketch = CountSketch(ops, 5, 300, seed=2)
        table = sketch.encode(torch.from_numpy(x), x.size)
        np.testing.assert_array_equal(table.numpy(), expected)
        np.testing.assert_array_equal(sketch.estimate(table, 0, 5000).numpy(),
                                      CountSketch(NumpyOps(), 5, 300, 2).estimate(expected, 0, 5000))


def test_mersenne_reduction_matches_python_modulo_at_the_edges():
    values = np.array([0, 1, PRIME - 1, PRIME, PRIME + 1, 2 * PRIME, (PRIME - 1) ** 2,
                       2 ** 62 - 1, 12345678901234], dtype=np.int64)
    assert kernels.mersenne_mod(values).tolist() == [v % PRIME for v in values.tolist()]


def test_signs_are_balanced_and_buckets_fill_evenly():
    buckets, parity = kernels.sketch_positions(0, 200_000, hash_coefficients(5, 1)[0], 1000)
    assert abs(parity.mean() - 0.5) < 0.01
    load = np.bincount(buckets, minlength=1000)
    assert load.min() > 120 and load.max() < 290  # 200 per bucket, binomial spread


def test_default_rows_grow_as_log_n():
    assert [rows_for(n) for n in (10, 85_002, 25_600_000, 2 ** 31 - 2)] == [3, 5, 7, 8]
    assert rows_for(85_002) == math.ceil(math.log2(85_002) / 4)


def test_count_abs_ge_each_matches_sorting_on_edge_values():
    rng = np.random.default_rng(4)
    rungs = np.sort(np.concatenate([[0.0], np.abs(rng.standard_normal(40)),
                                    [1.0, 1.0625, 1.125, 2.0 ** -130]])).astype(np.float32)
    x = np.concatenate([rng.standard_normal(5000), rungs, -rungs, [0.0, -0.0, 1e-45, 3e38]])
    x = x.astype(np.float32)
    magnitude = np.sort(np.abs(x))
    expected = magnitude.size - np.searchsorted(magnitude, rungs, side="left")
    assert kernels.count_abs_ge_each(x, rungs).tolist() == expected.tolist()


def test_count_abs_ge_each_counts_nan_at_no_rung():
    """As ``|x| >= t`` (and the generic ops' count) does, on the compiled path and
    the numpy one (float16, a strided vector)."""
    x = np.array([np.nan, 1.0, -np.nan, np.inf, 0.5, 2.0, 0, 0], np.float32)
    x.view(np.uint32)[6:] = 0x7F800001, 0xFF800001  # NaNs in inf's key, next to the inf rung
    rungs = [-1.0, 0.0, 0.5, 1.0, 2.0, np.inf]
    expected = [4, 4, 4, 3, 2, 1]
    assert [int((np.abs(x) >= np.float32(t)).sum()) for t in rungs] == expected
    assert np.isnan(x[6:]).all()
    for vector in (x, np.repeat(x, 2)[::2], x.astype(np.float16)):
        assert kernels.count_abs_ge_each(vector, rungs).tolist() == expected


def test_count_abs_ge_each_refuses_a_nan_threshold():
    with pytest.raises(ValueError, match="numbers"):
        kernels.count_abs_ge_each(np.ones(4, np.float32), [0.5, np.inf, np.nan])


@pytest.mark.parametrize("rungs", [[-1.0, -0.0, 0.0, 0.5], [0.25, 0.5, np.inf], [3e-39, 1e30],
                                   [], list(np.geomspace(1e-3, 1e3, 2000)),
                                   [0.5] * 5 + [1.0], list(np.geomspace(1.0, 1.01, 50)),
                                   [1.0, 1.00001, 1.00002, np.inf]])
def test_count_abs_ge_each_matches_sorting_on_any_ladder(rungs):
    """Ladders reaching below zero, to infinity, over subnormals, across twenty
    octaves (one key table entry per 1/128 octave), with many rungs inside one
    key (equal ones too), none, and several inside one key below an infinite
    one (an inf element once stepped past the ladder's end there)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_cauchy(20_000) * 10.0 ** rng.integers(-40, 30, 20_000)).astype(np.float32)
    x[:5] = [np.inf, -np.inf, 0.0, -0.0, np.nan]
    x[5:2005] = rng.uniform(0.99, 1.02, 2000)  # dense around the narrow ladder
    rungs = np.asarray(rungs, np.float32)
    magnitude = np.sort(np.abs(x[~np.isnan(x)]))  # NaN >= t is false
    expected = magnitude.size - np.searchsorted(magnitude, rungs, side="left")
    assert kernels.count_abs_ge_each(x, rungs).tolist() == expected.tolist()
