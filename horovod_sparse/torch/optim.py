"""DGC's optimizer: weight decay under momentum, the gradient's momentum left to DGC.

Under DGC's momentum correction the compressor owns the gradient's momentum
(``u = m u + g`` before selection), so the optimizer must not add it again.
The released DGC code (synxlin/deep-gradient-compression, ``DGCSGD``) still
gives the *weight decay* term its own momentum buffer, per parameter::

    b = m b + (1 - dampening) wd p      (b = wd p at the first step)
    d = b                               (Nesterov: d = wd p + m b)
    p = p - lr (d + grad)

and ``p = p - lr grad`` without weight decay.  :class:`DGCSGD` is that rule,
to be wrapped by ``hvd.DistributedOptimizer`` with a DGC compressor::

    optimizer = hvd.DistributedOptimizer(
        DGCSGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4),
        compression=horovod_sparse.torch.Compression.dgc(variant="paper", momentum=0.9))

The compressor accepts its ``momentum`` (it moves the weight decay only)
under a method that keeps the gradient's momentum itself (``dgc`` with
``momentum > 0``), and refuses it under any other: there the gradient would
get no momentum at all.
"""

import torch
from torch.optim.optimizer import required


class DGCSGD(torch.optim.Optimizer):
    """SGD whose ``momentum`` applies to the weight decay term only (DGC's optimizer)."""

    momentum_on_weight_decay_only = True  # read by the compressor's momentum check

    def __init__(self, params, lr=required, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        # lr may stay ``required`` when every group names its own (Horovod's optimizer
        # rebuilds this class from the wrapped optimizer's param_groups)
        settings = (("momentum", momentum), ("dampening", dampening),
                    ("weight_decay", weight_decay)) + (() if lr is required else (("lr", lr),))
        for name, value in settings:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if not isinstance(nesterov, bool):
            raise TypeError(f"nesterov must be True or False, got {nesterov!r}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            decay, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                step = p.grad
                if decay:
                    step = self._decay_step(p, decay, momentum, group).add_(p.grad)
                p.add_(step, alpha=-group["lr"])
        return loss

    def _decay_step(self, p, decay, momentum, group):
        """The weight decay's share of the step, ``b`` or (Nesterov) ``wd p + m b``."""
        decayed = p.mul(decay)
        if not momentum:
            return decayed
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = decayed.clone()
        else:
            state["momentum_buffer"].mul_(momentum).add_(decayed, alpha=1 - group["dampening"])
        buffer = state["momentum_buffer"]
        return decayed.add_(buffer, alpha=momentum) if group["nesterov"] else buffer.clone()
