"""The core on another stack equals the numpy references bit for bit: numpy over
mpi4py (mpirun -np 3).  TensorFlow: ``test_horovod_tensorflow.py``."""

import json

import pytest

from gradients import stream
from harness import CASES, check_rank_files
from launch import mpirun

pytestmark = pytest.mark.horovod


def test_mpi4py_core_matches_reference(tmp_path):
    steps, seed, density, size = 20, 5, 0.02, 3
    mpirun(size, "tests/workers/mpi_exchange.py", tmp_path, steps, seed, density, json.dumps(CASES))
    check_rank_files(tmp_path, CASES, stream(seed, steps, size), density)

