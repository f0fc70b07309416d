"""DGC's optimizer (``horovod_sparse.torch.DGCSGD``) against its rule, one process.

The rule (the released ``DGCSGD``): with weight decay ``wd`` a momentum buffer
``b = m b + (1 - dampening) wd p`` (``b = wd p`` at the first step), ``d = b``
(Nesterov ``d = wd p + m b``), ``p = p - lr (d + grad)``; without weight decay
``p = p - lr grad``.  The expected values are computed in float64 numpy.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from horovod_sparse.torch import DGCSGD  # noqa: E402


def expected_trajectory(p, grads, lr, momentum, dampening, weight_decay, nesterov):
    p, buffer, trajectory = p.astype(np.float64), None, []
    for g in grads:
        step = g.astype(np.float64)
        if weight_decay:
            decayed = weight_decay * p
            if momentum:
                buffer = decayed if buffer is None else momentum * buffer + (1 - dampening) * decayed
                decayed = decayed + momentum * buffer if nesterov else buffer
            step = decayed + step
        p = p - lr * step
        trajectory.append(p)
    return trajectory


@pytest.mark.parametrize("momentum,dampening,weight_decay,nesterov", [
    (0.9, 0.0, 0.01, False), (0.9, 0.0, 0.01, True), (0.9, 0.5, 0.01, False),
    (0.0, 0.0, 0.01, False), (0.9, 0.0, 0.0, False)])
def test_dgcsgd_follows_the_rule(momentum, dampening, weight_decay, nesterov):
    rng = np.random.default_rng(1)
    start = rng.standard_normal(7)
    grads = [rng.standard_normal(7) for _ in range(4)]
    parameter = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = DGCSGD([parameter], lr=0.1, momentum=momentum, dampening=dampening,
                       weight_decay=weight_decay, nesterov=nesterov)
    want = expected_trajectory(start, grads, 0.1, momentum, dampening, weight_decay, nesterov)
    for g, expected in zip(grads, want):
        parameter.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        np.testing.assert_allclose(parameter.detach().numpy(), expected, rtol=1e-12)


def test_dgcsgd_refuses_bad_settings():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="nesterov"):
        DGCSGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="weight_decay"):
        DGCSGD(params, lr=0.1, weight_decay=-1.0)
    with pytest.raises(TypeError, match="lr"):
        DGCSGD(params, lr="0.1")
