"""Horovod TensorFlow ``Compressor`` that exchanges the whole model's gradient sparsely.

Horovod's TensorFlow integrations build the gradient allreduce as a graph:
``DistributedGradientTape`` wraps it in a ``tf.function`` even in eager mode,
and Keras trains inside one.  So ``compress``/``decompress`` run while that
graph is *traced*, not at every step.  With ``groups=1`` Horovod allreduces
all gradients in one group and calls every ``compress`` before any
``decompress``; :class:`SparseCompressor` uses that:

* ``compress`` records the (symbolic) gradient and returns a one-element
  float32 placeholder, which Horovod's own grouped allreduce carries;
* the first ``decompress`` adds one ``tf.py_function`` op to the graph.  At
  every step it runs :class:`~horovod_sparse.core.GradientExchange` on all
  of the step's gradients -- TensorFlow ops on the gradients' device, Horovod
  collectives in eager mode -- and returns the averaged gradients; every
  ``decompress`` returns its own.

Without ``groups=1`` Horovod hands over one gradient at a time (compress,
allreduce, decompress, then the next), so the whole model is never in view:
the compressor sees this while tracing and raises a ``ValueError`` saying to
pass ``groups=1``.  Errors of a step (non-finite gradients, ranks whose models
differ) surface as ``tf.errors`` whose message is ours.

Gradients are named ``grad.<i>``, ``i`` the position of their variable in
the list Horovod reduces for (the tape's sources, the optimizer's variables),
which Horovod's ``allreduce_grads`` knows (``horovod_caller``).  A variable
whose gradient is ``None`` in a step (a branch not taken) is *held*: nothing
of it is sent and its residual waits, as dense Horovod leaves it untouched.
Horovod's ``op`` is honoured: ``hvd.Average`` and ``hvd.Sum``; others raise.
The compressor is trackable: ``tf.train.Checkpoint(
..., compression=compression)`` saves its state (step, residuals, the
sparsifier's thresholds and partitions) and restores it before the next step.
"""

import functools

import tensorflow as tf
from tensorflow.python.trackable.base import Trackable

from ..core import Layout, checkpoint, create
from ..core.compressor import WholeModelCompressor, method_factories
from ..core.consistency import check_identical
from .comm import HorovodTensorFlowCommunicator
from .horovod_caller import horovod_caller
from .ops import TensorFlowOps

_PER_TENSOR = ("horovod_sparse exchanges the whole model's gradient at once, but Horovod handed "
               "it one gradient at a time: pass groups=1 to hvd.DistributedGradientTape / "
               "hvd.DistributedOptimizer")


class _Trace:
    """The gradients one traced graph hands to ``compress``, their variables' positions,
    and the exchange op built for them."""

    def __init__(self, graph):
        self.graph = graph
        self.outer = getattr(graph, "outer_graph", None)
        self.grads = []
        self.positions = []   # per grad: its entry in ``layout``
        self.caller = None    # Horovod's view of the step (see ``horovod_caller``)
        self.placeholder = None
        self.outputs = None

    def record(self, tensor):
        """Append ``tensor``; return its slot."""
        self.positions.append(len(self.grads) if self.caller is None
                              else self.caller.position_of(tensor))
        self.grads.append(tensor)
        return len(self.grads) - 1

    def layout_and_held(self):
        """The whole model's layout (call order without Horovod's view), and the
        positions of the entries without a gradient in this trace."""
        if self.caller is None:
            return Layout(names=tuple(f"grad.{i}" for i in range(len(self.grads))),
                          shapes=tuple(tuple(g.shape) for g in self.grads),
                          dtypes=tuple(g.dtype.name for g in self.grads)), ()
        layout = self.caller.layout
        return layout, tuple(sorted(set(range(len(layout.names))) - set(self.positions)))


class _Slot:
    __slots__ = ("trace", "index")

    def __init__(self, trace, index):
        self.trace, self.index = trace, index


class SparseCompressor(WholeModelCompressor, Trackable):
    """A stateful Horovod compressor; one instance per tape or optimizer, with ``groups=1``.

    Parameters
    ----------
    sparsifier : a core sparsifier (``horovod_sparse.create(name, **kw)``).
    nonfinite : ``"raise"`` or ``"skip"`` (see ``core.exchange``).
    process_set : Horovod process set to exchange within (default: the tape's or
        optimizer's, else all ranks; one that differs from theirs raises).
    dense_below, dense_1d : gradients with fewer than ``dense_below``
        elements (``None``: none), and with ``dense_1d`` every one-dimensional
        gradient, are averaged exactly in the same step instead of sparsified.
    fallback : ``"auto"``: dense steps where sparse ones are slower
        (``core.fallback``); ``None`` (default): always the method.
    check_every : every this many steps check (before the exchange) that all
        ranks hold bit-identical variables; raises
        :class:`~horovod_sparse.core.ParameterDivergenceError` naming the first
        differing variable on every rank.  ``None`` (default) never checks.
        Needs Horovod's tape or optimizer (which know the variables).

    Checkpoints: by default each rank's checkpoint holds its own state (the
    residuals are per rank).  For a checkpoint rank 0 alone writes, call
    :meth:`gather_for_checkpoint` on every rank first; restoring it works on
    any number of ranks (``core.checkpoint`` says what a new rank count gets).
    """

    def __init__(self, sparsifier, nonfinite="raise", process_set=None, dense_below=None,
                 dense_1d=False, fallback=None, check_every=None):
        super().__init__(sparsifier, nonfinite, dense_below, dense_1d, fallback, check_every,
                         process_set)
        self._variables = None  # the model's variables, from Horovod's view of the step
        self._trace = None
        self._gathered = None
        self._agreed = False

    # -- Horovod's Compressor interface (plain Python: AutoGraph must not convert it)
    @tf.autograph.experimental.do_not_convert
    def compress(self, tensor):
        if not tensor.dtype.is_floating or tensor.shape.num_elements() == 0:
            return tensor, None
        trace = self._trace_for(tf.compat.v1.get_default_graph())
        if not trace.grads:
            trace.caller = horovod_caller()
            if trace.caller is not None:
                self._adopt(trace.caller)
            elif self.check_every:
                raise ValueError("check_every needs hvd.DistributedGradientTape or Horovod's "
                                 "DistributedOptimizer, which know the variables")
            trace.placeholder = self._agreed_placeholder(trace)
        return tf.identity(trace.placeholder), _Slot(trace, trace.record(tensor))

    def _adopt(self, caller):
        """Take the reduction, the variables and the process set of Horovod's tape or
        optimizer (:class:`HorovodStep`).  One compressor serves one list of variables:
        another list raises ``ValueError``, even where the shapes agree."""
        if self._variables is not None and (
                len(caller.variables) != len(self._variables)
                or any(a is not b for a, b in zip(caller.variables, self._variables))):
            raise ValueError("this compressor already exchanges the gradients of other "
                             "variables (another tape or optimizer, another list of sources "
                             "for gradient(), or a rebuilt model): use one compressor per "
                             "DistributedGradientTape or DistributedOptimizer and its variables")
        if caller.process_set is not None:
            self.adopt_process_set(caller.process_set)
        self.reduction, self._variables = caller.reduction, caller.variables

    def _agreed_placeholder(self, trace):
        """The float32 ``[0.]`` Horovod's grouped allreduce carries, computed after the
        ranks have agreed on the whole model and the configuration (once; a rank with
        an extra variable would otherwise hang in that allreduce)."""
        def agree():
            if not self._agreed and trace.caller is not None:
                self.check_agreement(trace.caller.layout)
            self._agreed = True
            return tf.zeros([1], tf.float32)

        if tf.executing_eagerly():
            return agree()
        placeholder = tf.py_function(agree, [], tf.float32)
        placeholder.set_shape([1])
        return placeholder

    @tf.autograph.experimental.do_not_convert
    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        trace = ctx.trace
        if trace.outputs is None:
            step = functools.partial(self._reduce_step, trace)
            if tf.executing_eagerly():
                trace.outputs = step(*trace.grads)
            else:
                with tf.control_dependencies([tensor]):  # after Horovod's placeholder allreduce
                    outputs = tf.py_function(step, trace.grads,
                                             Tout=[g.dtype for g in trace.grads])
                for output, grad in zip(outputs, trace.grads):
                    output.set_shape(grad.shape)
                trace.outputs = outputs
        return trace.outputs[ctx.index]

    def _trace_for(self, graph):
        trace = self._trace
        if tf.executing_eagerly():
            if trace is None or trace.outputs is not None:  # eager: every step anew
                self._trace = _Trace(graph)
            return self._trace
        if trace is not None and trace.outputs is not None and (
                trace.graph is graph or (trace.outer is not None and trace.outer is getattr(
                    graph, "outer_graph", None))):
            raise ValueError(_PER_TENSOR)
        if trace is None or trace.graph is not graph:
            self._trace = _Trace(graph)
        return self._trace

    # -- the step (runs eagerly, inside tf.py_function in a graph) ------------
    def _reduce_step(self, trace, *grads):
        layout, held = trace.layout_and_held()
        flat_grads = [None] * len(layout.names)
        for position, grad in zip(trace.positions, grads):
            flat_grads[position] = tf.reshape(grad, [-1])
        self.guard()
        flat = self.reduce(flat_grads, layout, held)
        bounds = self.output_bounds
        return [tf.cast(tf.reshape(flat[bounds[p][0]:bounds[p][1]], g.shape), g.dtype)
                for p, g in zip(trace.positions, grads)]

    def _ops(self):
        return TensorFlowOps()

    def _communicator(self):
        return HorovodTensorFlowCommunicator(self._process_set)

    def _check_parameters(self):
        check_identical(*_names_and_bytes(self._variables), self.comm)

    # -- checkpoints ----------------------------------------------------------
    def gather_for_checkpoint(self):
        """Collect every rank's state (collective) for the next ``Checkpoint.save``
        at this step, so that rank 0's checkpoint alone holds all of it."""
        self._gathered = (self.steps_done, self.state_dict(all_ranks=True))

    def _serialize_to_tensors(self):
        state = self.state_dict()
        if self._gathered is not None:
            step, gathered = self._gathered
            if step != self.steps_done:
                raise ValueError(f"gather_for_checkpoint() was called at step {step}, the "
                                 f"compressor is at step {self.steps_done}: call it again "
                                 "(on every rank) right before saving")
            state = gathered
        return {"state": tf.constant(checkpoint.encode(state))}

    def _restore_from_tensors(self, restored_tensors):
        self.load_state_dict(checkpoint.decode(restored_tensors["state"].numpy()))
        return tf.no_op()


def check_parameters(variables, process_set=None):
    """The consistency guard: raise :class:`~horovod_sparse.core.ParameterDivergenceError`
    on every rank unless all ranks of ``process_set`` (default: all) hold
    bit-identical ``variables`` (eager)."""
    check_identical(*_names_and_bytes(variables), HorovodTensorFlowCommunicator(process_set))


def _names_and_bytes(variables):
    variables = list(variables)
    return [v.name for v in variables], [tf.io.serialize_tensor(v).numpy() for v in variables]


@method_factories
class Compression:
    """Factories, used like Horovod's ``hvd.Compression.fp16``::

        tape = hvd.DistributedGradientTape(
            tape, groups=1,
            compression=horovod_sparse.tensorflow.Compression.exdyna(density=0.001))

    Every factory takes ``density`` and the method's hyper-parameters, plus
    the optional ``nonfinite``, ``process_set``, ``dense_below``, ``dense_1d``,
    ``fallback`` and ``check_every`` (see :class:`SparseCompressor`).
    """

    @staticmethod
    def create(name, nonfinite="raise", process_set=None, dense_below=None, dense_1d=False,
               fallback=None, check_every=None, **hyperparameters):
        return SparseCompressor(create(name, **hyperparameters), nonfinite=nonfinite,
                                process_set=process_set, dense_below=dense_below,
                                dense_1d=dense_1d, fallback=fallback, check_every=check_every)


__all__ = ["Compression", "SparseCompressor", "check_parameters"]
