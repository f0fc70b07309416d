"""What Horovod's TensorFlow ``allreduce_grads`` knows about the gradients it
hands to ``compress``.

Horovod's tape and Keras optimizer reduce through one function,
``allreduce_grads(grads, vars)`` (built by ``_make_cached_allreduce_grads_fn``),
which drops ``None`` gradients before grouping and knows, for every gradient,
the position of its variable in ``vars`` (``index_group``) and the reduction
``op``.  ``compress`` only sees the gradient tensor; :func:`horovod_caller`
finds that frame on the stack while the graph is traced (by its name: in
eager mode Horovod wraps it in a ``tf.function``, and AutoGraph's conversion
renames it ``tf__allreduce_grads``), so the compressor can lay out the
*whole* model -- including variables whose gradient is ``None`` this step --
identically on every rank.
"""

import sys

import horovod.tensorflow as hvd
import tensorflow as tf

from ..core import Layout
from ..core.compressor import reduction_of

_NAMES = ("allreduce_grads", "tf__allreduce_grads")
_GROUPED_NAMES = ("grouped_allreduce", "tf__grouped_allreduce")  # call compress; know the set
_SEARCH_DEPTH = 64  # frames between compress() and allreduce_grads (tf.cond, AutoGraph)
_LOCALS = {"vars": (list, tuple), "grads": (list, tuple), "index_group": list, "grad_group": list,
           "op": int}


class HorovodStep:
    """The variables of one traced reduction, where each gradient belongs, its
    reduction and its process set (``None`` where no frame held one).

    ``layout`` lists every floating, non-empty variable whose gradient is not
    ``tf.IndexedSlices`` (Horovod allgathers those itself), named ``grad.<i>``
    by the variable's position ``i``; ``variables`` are those variables.
    """

    def __init__(self, variables, grads, index_group, grad_group, op, process_set):
        self.reduction = reduction_of(op, hvd)
        self.process_set = process_set
        entries = [i for i, (variable, grad) in enumerate(zip(variables, grads))
                   if variable.dtype.is_floating and variable.shape.num_elements()
                   and not isinstance(grad, tf.IndexedSlices)]
        self.variables = [variables[i] for i in entries]
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
    (a direct ``hvd.grouped_allreduce(..., compression=...)``, no ``vars``).

    Under AutoGraph the loop's ``index_group``/``grad_group`` live in a converted
    loop body below ``tf__allreduce_grads`` (which holds placeholders for them), so
    each name is taken from the nearest frame that holds a real value."""
    found, process_set = {}, None  # process_set: hvd.grouped_allreduce's argument
    frame = sys._getframe(1)
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        scope = frame.f_locals
        for name, kind in _LOCALS.items():
            if name not in found and isinstance(scope.get(name), kind):
                found[name] = scope[name]
        if frame.f_code.co_name in _GROUPED_NAMES and process_set is None:
            process_set = scope.get("process_set")
        if frame.f_code.co_name in _NAMES:
            if len(found) < len(_LOCALS):
                return None
            return HorovodStep(found["vars"], found["grads"], found["index_group"],
                               found["grad_group"], found["op"], process_set)
        frame = frame.f_back
    return None
