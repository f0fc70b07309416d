"""The core on other stacks equals the numpy references bit for bit: numpy over
mpi4py (mpirun -np 3) and TensorFlow tensors over Horovod's TF collectives
(horovodrun -np 2)."""

import json

import numpy as np
import pytest

import reference
from gradients import sizes, stream
from harness import CASES, check_extras
from launch import horovodrun, mpirun

pytestmark = pytest.mark.horovod


def _compare(tmp_path, steps, seed, density, size):
    grads = stream(seed, steps, size)
    for index, (method, options) in enumerate(CASES):
        expected = reference.run(method, grads, density, sizes(), **options)
        for rank in range(size):
            got = np.load(tmp_path / f"case{index}.rank{rank}.npz")
            for step, want in enumerate(expected):
                where = f"{method} {options} rank {rank} step {step}"
                np.testing.assert_array_equal(got["aggregate"][step], want["aggregate"], where)
                np.testing.assert_array_equal(got["residual"][step], want["residuals"][rank], where)
                assert list(got["counts"][step]) == want["counts"], where
                check_extras({key: got[key][step] for key in ("threshold", "edges", "velocity")},
                             want, rank, where)


def test_mpi4py_core_matches_reference(tmp_path):
    steps, seed, density, size = 20, 5, 0.02, 3
    mpirun(size, "tests/workers/mpi_exchange.py", tmp_path, steps, seed, density, json.dumps(CASES))
    _compare(tmp_path, steps, seed, density, size)


def test_tensorflow_core_matches_reference(tmp_path):
    steps, seed, density, size = 12, 6, 0.02, 2
    horovodrun(size, "tests/workers/tf_exchange.py", tmp_path, steps, seed, density,
               json.dumps(CASES))
    _compare(tmp_path, steps, seed, density, size)
