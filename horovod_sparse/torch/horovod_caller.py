"""What Horovod's PyTorch ``DistributedOptimizer`` knows about the gradient it
hands to ``compress``.

Horovod's ``Compressor`` interface passes a bare tensor (``p.grad``).  The
optimizer calling it knows more, and the same on every rank: *which*
parameter the gradient belongs to, that parameter's name (the user's
``named_parameters``, or Horovod's own ``allreduce.noname.<group>.<index>``),
the reduction ``op`` and the optimizer's hyper-parameters.  Horovod calls
``compress`` from ``_allreduce_grad_async(self, p)`` (or, with ``groups``,
from a comprehension over ``p`` inside ``_grouped_allreduce_grad_async``);
:func:`horovod_caller` finds that frame on the stack by its code object --
so a ``compress`` wrapped by the user still works -- and returns the
optimizer and the parameter.

Naming by parameter, not by call order, is what keeps the ranks aligned when
the set of parameters that get a gradient differs between ranks (a
data-dependent branch, a mixture of experts): Horovod then submits the
missing ones from a ``set`` whose order differs between processes.
"""

import sys

import horovod.torch as hvd
from horovod.torch.optimizer import _DistributedAdasumOptimizer, _DistributedOptimizer

from ..core.compressor import reduction_of

_CALLERS = frozenset({_DistributedOptimizer._allreduce_grad_async.__code__,
                      _DistributedOptimizer._grouped_allreduce_grad_async.__code__})
_ADASUM_CALLER = _DistributedAdasumOptimizer._allreduce_grad_async.__code__
_SEARCH_DEPTH = 8  # frames between compress() and Horovod's caller (wrappers included)


def horovod_caller():
    """``(optimizer, parameter)`` of the Horovod ``DistributedOptimizer`` call that
    is compressing a gradient right now, or ``None`` when the caller is not one
    (``hvd.allreduce(tensor, compression=...)``, a test).  Horovod's Adasum
    optimizer (``op=hvd.Adasum``) raises."""
    child, frame = None, sys._getframe(1)
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        if frame.f_code is _ADASUM_CALLER:
            reduction_of(hvd.Adasum, hvd)
        if frame.f_code in _CALLERS:
            scope = frame.f_locals
            parameter = scope["p"] if "p" in scope else child.f_locals["p"]
            return scope["self"], parameter
        child, frame = frame, frame.f_back
    return None


def trained_parameters(optimizer):
    """The parameters Horovod exchanges gradients of, in ``param_groups`` order
    (identical on every rank), with their Horovod names."""
    return [(optimizer._parameter_names[p], p) for group in optimizer.param_groups
            for p in group["params"] if p in optimizer._requires_update]


def release_pending(optimizer):
    """Forget the optimizer's pending handles, as a completed ``synchronize()``
    does, so that a caught error leaves it usable for the next step."""
    optimizer._handles.clear()
