"""What Horovod's TensorFlow ``allreduce_grads`` knows about the gradients it
hands to ``compress``.

Horovod's tape and Keras optimizer reduce through one function,
``allreduce_grads(grads, vars)`` (built by ``_make_cached_allreduce_grads_fn``),
which drops ``None`` gradients before grouping and knows, for every gradient,
the position of its variable in ``vars`` (``index_group``) and the reduction
``op``.  ``compress`` only sees the gradient tensor; :func:`horovod_caller`
finds that frame on the stack (by function name and Horovod's file) while the
graph is traced, so the compressor can lay out the *whole* model -- including
variables whose gradient is ``None`` this step -- identically on every rank.
"""

import sys

import horovod.tensorflow as hvd
import tensorflow as tf

from ..core import Layout

_HOROVOD_FILE = hvd.__file__
_SEARCH_DEPTH = 12  # frames between compress() and allreduce_grads (tf.cond, grouping)
_REDUCTIONS = {hvd.Average: "average", hvd.Sum: "sum"}


class HorovodStep:
    """The variables of one traced reduction, and where each gradient belongs.

    ``layout`` lists every floating, non-empty variable whose gradient is not
    ``tf.IndexedSlices`` (Horovod allgathers those itself), named ``grad.<i>``
    by the variable's position ``i``.
    """

    def __init__(self, variables, grads, index_group, grad_group, op):
        self.reduction = reduction_of(op)
        entries = [i for i, (variable, grad) in enumerate(zip(variables, grads))
                   if variable.dtype.is_floating and variable.shape.num_elements()
                   and not isinstance(grad, tf.IndexedSlices)]
        self.layout = Layout(names=tuple(f"grad.{i}" for i in entries),
                             shapes=tuple(tuple(variables[i].shape) for i in entries),
                             dtypes=tuple(variables[i].dtype.name for i in entries))
        entry_of = {i: position for position, i in enumerate(entries)}
        self._positions = {id(grad): entry_of[i] for i, grad in zip(index_group, grad_group)
                           if i in entry_of}

    def position_of(self, tensor):
        """The layout entry of the gradient ``tensor``."""
        return self._positions[id(tensor)]


def horovod_caller():
    """:class:`HorovodStep` of the ``allreduce_grads`` call being traced, or ``None``
    (a direct ``hvd.grouped_allreduce(..., compression=...)``, no ``vars``)."""
    frame = sys._getframe(1)
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name == "allreduce_grads" and code.co_filename == _HOROVOD_FILE:
            scope = frame.f_locals
            if scope.get("vars") is None or "index_group" not in scope:
                return None
            return HorovodStep(scope["vars"], scope["grads"], scope["index_group"],
                               scope["grad_group"], scope["op"])
        frame = frame.f_back
    return None


def reduction_of(op):
    """``"average"`` or ``"sum"`` for Horovod's ``op``; any other op raises."""
    if op in _REDUCTIONS:
        return _REDUCTIONS[op]
    name = "hvd.Adasum" if op == hvd.Adasum else f"op={op!r}"
    raise ValueError(f"horovod_sparse supports op=hvd.Average (the default) and op=hvd.Sum, "
                     f"not {name}: sparse gradients are averaged or summed")
