"""Set-up facts: Horovod's build and a core that needs no framework."""

import os
import subprocess
import sys

from launch import BIN, ROOT

CORE_WITHOUT_FRAMEWORKS = """
import sys
for blocked in ("torch", "tensorflow", "horovod", "mpi4py"):
    sys.modules[blocked] = None  # any import of these now fails
import numpy as np
import horovod_sparse
from horovod_sparse.core import GradientExchange, Layout, NumpyOps, create, run_simulated
import horovod_sparse.core.gossip, horovod_sparse.core.sketch, horovod_sparse.core.consistency
layout = Layout(("w",), ((100,),), ("float32",))
def worker(comm):
    exchange = GradientExchange(create("exdyna", density=0.05), NumpyOps(), comm)
    grad = np.random.default_rng(comm.rank).standard_normal(100).astype(np.float32)
    return exchange.step([grad], layout)
a, b = run_simulated(2, worker)
assert (a == b).all() and np.count_nonzero(a) > 0
print("core ok", horovod_sparse.available())
"""


def test_core_imports_and_runs_without_torch_tensorflow_or_horovod():
    out = subprocess.run([sys.executable, "-c", CORE_WITHOUT_FRAMEWORKS], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("core ok ['cltk', 'deft', 'dgc', 'exdyna', 'gssgd', 'gtopk', 'micro', 'randomk', "
            "'threshold', 'topk']") in out.stdout


def test_horovod_build_lists_both_frameworks_and_both_controllers():
    out = subprocess.run([os.path.join(BIN, "horovodrun"), "--check-build"], capture_output=True,
                         text=True, timeout=120).stdout
    for line in ("[X] TensorFlow", "[X] PyTorch", "[X] MPI", "[X] Gloo"):
        assert line in out, out
