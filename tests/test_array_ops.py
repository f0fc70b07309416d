"""The derived ``ArrayOps`` operations equal plain numpy, on every backend.

``ArrayOps`` asks a backend for its primitives (its abstract methods) and
writes every other operation with them; a backend overrides a default only to
be faster.  Each derived operation is checked three ways: as the defaults
alone compute it (numpy primitives and nothing else), and as the torch and
TensorFlow backends compute it, with their overrides.
"""

import math

import numpy as np
import pytest

from horovod_sparse.core.ops import ArrayOps, NumpyOps

PrimitivesOnly = type("PrimitivesOnly", (ArrayOps,),
                      {name: getattr(NumpyOps, name) for name in ArrayOps.__abstractmethods__})


def backend(name):
    """``(ops, to_vector, to_buffer)``: the backend and how it holds a numpy array
    as a value and as an in-place buffer."""
    if name == "defaults":
        return PrimitivesOnly(), np.array, np.array
    if name == "torch":
        torch = pytest.importorskip("torch")
        from horovod_sparse.torch.ops import TorchOps
        return TorchOps(), torch.from_numpy, lambda a: torch.from_numpy(a.copy())
    tf = pytest.importorskip("tensorflow")
    from horovod_sparse.tensorflow.ops import TensorFlowOps
    return TensorFlowOps(), tf.constant, lambda a: tf.Variable(a)


BACKENDS = ["defaults", "torch", "tensorflow"]


def host(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


@pytest.fixture
def values():
    x = np.random.default_rng(0).standard_t(3, 1000).astype(np.float32)
    x[::7] = x[3]  # ties at a threshold taken from the data
    return x


def test_a_backend_without_a_primitive_cannot_be_made():
    partial = type("Partial", (ArrayOps,), {name: getattr(NumpyOps, name)
                                            for name in sorted(ArrayOps.__abstractmethods__)[1:]})
    with pytest.raises(TypeError, match="abstract"):
        partial()


@pytest.mark.parametrize("name", BACKENDS)
def test_derived_operations_match_numpy(name, values):
    ops, vector, buffer = backend(name)
    threshold = float(abs(values[3]))
    indices = np.flatnonzero(np.abs(values) > 1.0).astype(np.int64)

    selected = ops.select_abs_ge(vector(indices), vector(values[indices]), threshold)
    assert np.array_equal(host(selected), indices[np.abs(values[indices]) >= np.float32(threshold)])
    assert ops.count_unique(vector(np.array([5, 1, 5, 3, 1], np.int64))) == 3
    thresholds = np.array([0.5, threshold, 2.0])
    assert list(ops.count_abs_ge_each(vector(values), thresholds)) == [
        int((np.abs(values) >= np.float32(t)).sum()) for t in thresholds]
    a, b = np.array([1, 4, 6, 9], np.int64), np.array([0, 4, 9, 12], np.int64)
    assert list(host(ops.intersect(vector(a), vector(b)))) == [4, 9]
    assert ops.max_abs(vector(values)) == float(np.abs(values).max())
    assert ops.max_abs(vector(values[:0])) == 0.0
    assert ops.all_finite(vector(values))
    with_inf = values.copy()
    with_inf[17] = np.inf
    assert not ops.all_finite(vector(with_inf))


@pytest.mark.parametrize("name", BACKENDS)
def test_derived_updates_in_place_match_numpy(name, values):
    ops, vector, buffer = backend(name)
    out = buffer(np.zeros(1000, np.float32))
    ops.add_slice(out, vector(values), vector(values[10:20] * 3), 10, 20)
    expected = np.zeros(1000, np.float32)
    expected[10:20] = values[10:20] + values[10:20] * 3
    assert np.array_equal(host(out), expected)

    kept = buffer(values.copy())
    at = np.array([2, 40, 999], np.int64)
    ops.keep_rounding_error(kept, vector(at), "float16")
    expected = values.copy()
    expected[at] -= values[at].astype(np.float16).astype(np.float32)
    assert np.array_equal(host(kept), expected)

    ops.fill_zero(kept)
    assert not host(kept).any()


@pytest.mark.parametrize("name", BACKENDS)
def test_scatter_add_sums_repeated_indices(name):
    ops, vector, buffer = backend(name)
    dense = buffer(np.zeros(4, np.float32))
    ops.scatter_add(dense, vector(np.array([1, 3, 1], np.int64)),
                    vector(np.array([0.5, 2.0, 0.25], np.float32)))
    assert list(host(dense)) == [0.0, 0.75, 0.0, 2.0]


@pytest.mark.parametrize("name", BACKENDS)
def test_segment_norms_and_slice_copies_match_numpy(name, values):
    """Two primitives the error feedback leans on: float64 norms (TensorFlow's
    chunked, here several chunks a segment) and a slice copy into a buffer."""
    ops, vector, buffer = backend(name)
    ops.chunk = 300  # used by the backends that cast a chunk at a time
    bounds = [(0, 10), (10, 10), (10, 700), (700, 1000)]
    expected = [math.fsum(float(v) ** 2 for v in values[s:e]) for s, e in bounds]
    assert np.allclose(ops.segment_sq_norms(buffer(values.copy()), bounds), expected, rtol=1e-12)

    out = buffer(np.zeros(1000, np.float32))
    ops.copy_slice(out, vector(values[:100]), 300, 400)
    expected = np.zeros(1000, np.float32)
    expected[300:400] = values[:100]
    assert np.array_equal(host(out), expected)
