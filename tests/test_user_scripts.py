"""The scripts Horovod users write (PyTorch, horovodrun -np 2): each ends as dense
Horovod does or with a clear error on every rank -- never a hang, never a silently
wrong gradient.  The rank program is ``tests/workers/torch_user_scripts.py``."""

import pytest

from launch import horovodrun
from records import assert_rank_checks

pytestmark = pytest.mark.horovod


@pytest.mark.parametrize("scenario", [
    "experts",      # unnamed gradients, data-dependent experts: same as dense, ranks identical
    "ops",          # op=hvd.Sum honoured, hvd.Adasum refused by name
    "checkpoints",  # rank 0's own state loaded elsewhere raises; one-rank gather times out
    "nonfinite",    # NaN at the first step: raise/skip on every rank; a caught error recovers
    "grad_scaler",  # nonfinite="propagate": GradScaler's scale follows dense's
    "mismatches",   # extra layer, other method, other density: errors, no hang
    "frozen",       # a layer frozen mid-training is not moved; its residual is held
    "dense_part",   # dense_below above every size = dense; DGC's dense part = momentum SGD
    "slips",        # uncalled factory, shared generator, sparse embedding, momentum twice
    "options",      # sparse_as_dense, process_set, step() after synchronize(): as dense
    "fallback",     # fallback="auto": Horovod's own allreduce = the exchange's dense step
])
def test_user_script_behaves_like_dense_horovod_or_fails_clearly(scenario, tmp_path):
    horovodrun(2, "tests/workers/torch_user_scripts.py", scenario, tmp_path, timeout=240)
    assert_rank_checks(tmp_path, 2)
