"""Horovod ``Compressor`` that exchanges the whole model's gradient sparsely.

Horovod's ``DistributedOptimizer`` calls ``compress(grad)`` once per
parameter from the backward hooks, allreduces what it returns, and calls
``decompress(output, ctx)`` per parameter in ``synchronize()`` -- every
``compress`` of a step before any ``decompress``.  :class:`SparseCompressor`
uses that order to run the *whole-model* algorithm:

* ``compress`` records the gradient and returns a one-element float32
  placeholder (Horovod's own allreduce then moves 4 bytes per parameter);
* the first ``decompress`` of the step flattens all recorded gradients in a
  fixed order, runs :class:`~horovod_sparse.core.GradientExchange` (selection,
  error feedback, Horovod allgather/allreduce of the sparse data) and caches
  the aggregate; every ``decompress`` returns its parameter's slice.

Identification: each gradient is recognised by its *parameter*, which
Horovod's optimizer knows (``horovod_caller``), so the flat order is the
``param_groups`` order on every rank, whatever order the hooks fire in and
whichever parameters got no gradient this step.  Names come from the
compressor's ``named_parameters`` if given, else from Horovod's (the
optimizer's ``named_parameters``, or ``allreduce.noname.<group>.<index>``).
Called outside a ``DistributedOptimizer`` (``hvd.allreduce(t,
compression=...)``), gradients are found by identity among the given
``named_parameters``, or named ``grad.<i>`` by call order.

What the optimizer also tells, and what follows:

* ``op``: ``hvd.Average`` and ``hvd.Sum`` are honoured; any other op raises;
* ``process_set``: the exchange runs within it;
* ``sparse_as_dense``: a sparse gradient (``Embedding(sparse=True)``) arrives
  densified and is exchanged like any other; without it, it raises;
* ``step()`` after ``synchronize()`` outside ``skip_synchronize()`` (Horovod
  warns) reduces the step's aggregate again: it passes through to Horovod's
  allreduce, as for dense users, not into a second sparse exchange;
* a parameter with ``requires_grad=False`` (frozen after the optimizer was
  built) is *held*: nothing of it is sent, the exchange returns zeros for it
  and its residual waits until it is unfrozen;
* an optimizer with ``momentum`` under a method that applies momentum
  correction itself (DGC, gs-SGD) raises: the momentum would count twice.

At the first ``compress`` ever -- before this rank has submitted anything to
Horovod -- the ranks compare the whole model and the compressor's
configuration, so a rank with an extra layer or another method raises
:class:`~horovod_sparse.core.ModelMismatchError` /
:class:`~horovod_sparse.core.ConfigurationMismatchError` everywhere instead of
hanging in Horovod.  Every step's header repeats the check.

Errors of a step that every rank raises alike (non-finite gradients,
mismatches, the consistency guard) surface from the step's *last*
``decompress``, after Horovod has synchronized every handle, and Horovod's
pending handles are released: a caught error leaves the optimizer usable and
the residual as it was.  ``p.grad`` is left as it was too, except where the
gradients were accumulated in place into the last step's output
(``zero_grad(set_to_none=False)``): the exchange forms ``gradient +
residual`` in that buffer before the header refuses the step, so zero the
gradients before the next backward, as a training loop does anyway.

Tensors that are not floating point, or empty, pass through unchanged
(Horovod allreduces them as usual).
"""

import horovod.torch as hvd
import torch

from ..core import HorovodSparseError, Layout, create
from ..core.compressor import WholeModelCompressor, method_factories, reduction_of
from ..core.consistency import check_identical
from .comm import HorovodTorchCommunicator
from .horovod_caller import horovod_caller, release_pending, trained_parameters
from .ops import TorchOps


class _Gradient:
    """One recorded ``compress`` call: which parameter, its gradient, whether held."""

    __slots__ = ("name", "position", "tensor", "held")

    def __init__(self, name, position, tensor, held=False):
        self.name, self.position, self.tensor, self.held = name, position, tensor, held


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class _Plain(_Slot):
    """A gradient of a plain dense step; ``index``: its position in the layout where
    the exchange applies momentum to the result (else ``None``)."""


_PLAIN = _Plain(None)


class SparseCompressor(WholeModelCompressor):
    """A stateful Horovod compressor; use one instance per ``DistributedOptimizer``.

    Parameters
    ----------
    sparsifier : a core sparsifier (``horovod_sparse.create(name, **kw)``).
    named_parameters : optional ``model.named_parameters()``; names the
        residuals in ``state_dict``.  Read at the first step, so the same
        generator may also be given to ``hvd.DistributedOptimizer``.
    nonfinite : ``"raise"``, ``"skip"`` or ``"propagate"`` (for
        ``torch.amp.GradScaler``; see ``core.exchange``).
    process_set : Horovod process set to exchange within (default: the
        ``DistributedOptimizer``'s, else all ranks; one that differs from the
        optimizer's raises).
    check_every : every this many steps check (before the exchange) that all
        ranks hold bit-identical parameters; raises
        :class:`~horovod_sparse.core.ParameterDivergenceError` naming the first
        differing tensor on every rank.  ``None`` (default) never checks.
    dense_below, dense_1d : gradients with fewer than ``dense_below``
        elements (``None``: none), and with ``dense_1d`` every one-dimensional
        gradient (biases, norm scales), are averaged exactly in the same step
        instead of sparsified; density is then counted over the sparsified part
        (``overall_density`` counts both).
    fallback : ``"auto"`` times sparse and dense steps and runs the faster,
        re-checking now and then (checks at least 200 steps apart, the slower
        kind probed within 1 % of the training time, a sparse first choice and
        a later change of choice confirmed by a second check; ``core.fallback``);
        ``None`` (default) always runs the method.

    Metrics (``metrics()``, ``history``, ``summary()``) and checkpoint state
    (``state_dict(all_ranks=False)``, ``load_state_dict``) come from
    :class:`~horovod_sparse.core.compressor.WholeModelCompressor`.
    """

    def __init__(self, sparsifier, named_parameters=None, nonfinite="raise", process_set=None,
                 check_every=None, dense_below=None, dense_1d=False, fallback=None):
        super().__init__(sparsifier, nonfinite, dense_below, dense_1d, fallback, check_every,
                         process_set)
        self._named_parameters = named_parameters
        self._parameters = None      # [(name, parameter)] in flattening order, from the first step
        self._positions = None       # parameter -> position in _parameters
        self._optimizer = None       # Horovod's DistributedOptimizer, when it is the caller
        self._by_gradient = {}       # outside an optimizer: id(p.grad) -> position
        self._recorded = []          # _Gradient per compress call this step (plain: the tensor)
        self._outcome = None         # the step's aggregates, or the error every rank raises
        self._decompressed = 0
        self._whole = None           # a dense fallback step's kind: "whole" or "plain" (below)
        self._whole_results = []     # its decompressed gradients
        self._plain_finite = True    # a plain dense step's results so far are finite
        self._whole_index = (None, {})  # (layout, gradient name -> position in it)

    # -- Horovod's Compressor interface ---------------------------------------
    def compress(self, tensor):
        if not tensor.is_floating_point() or tensor.numel() == 0:
            return tensor, None
        caller = horovod_caller()
        if caller is not None and self._reduces_again(*caller):
            return tensor, None
        if self._outcome is not None:  # first compress after an exchange: a new step
            self._outcome, self._recorded, self._decompressed = None, [], 0
        if not self._recorded:
            self.follow_world()
            self._whole = self._whole_step_begins()
        if self._whole == "plain":  # a dense step with nothing to add: the gradient itself
            self._recorded.append(tensor)
            return tensor, _PLAIN
        if self._whole == "momentum":  # the same, momentum applied to the result
            self._recorded.append(tensor)
            return tensor, _Plain(self._whole_index[1][self._identify(tensor, caller).name])
        gradient = self._identify(tensor, caller)
        self._recorded.append(gradient)
        slot = _Slot(len(self._recorded) - 1)
        if self._whole:
            return self._send_whole(gradient), slot
        # float32 whatever the gradient's dtype: Horovod cannot allreduce bfloat16 on CPU
        return torch.zeros(1, device=tensor.device), slot

    def _reduces_again(self, optimizer, parameter):
        """Whether Horovod's ``synchronize()`` is reducing an aggregate again: ``step()``
        after ``synchronize()`` outside ``skip_synchronize()`` (Horovod warns), or a second
        ``synchronize()``.  Then the gradients are the last exchange's result, alike on
        every rank, and pass through to Horovod's allreduce as for dense users (which
        averages them to themselves at 2, 4, 8... ranks) -- not into a second sparse
        exchange.  Told apart from a step whose gradients are new: Horovod's backward
        hook has counted this gradient down (``_allreduce_delay`` 0), or this step's
        first ``compress`` came already (``_outcome`` reset).  ``_synchronized`` alone
        would not do: it stays set after a step that ``GradScaler`` skipped."""
        return (optimizer._synchronized and self._outcome is not None
                and optimizer._allreduce_delay[parameter] != 0)

    def decompress(self, tensor, ctx):
        if ctx is None:
            return tensor
        if type(ctx) is _Plain:
            return self._plain_result(tensor, ctx.index)
        if self._whole:
            return self._whole_result(tensor, ctx)
        if self._outcome is None:
            try:
                self._outcome = self._reduce_step()
            except HorovodSparseError as error:  # raised alike on every rank
                self._outcome = error
        self._decompressed += 1
        if isinstance(self._outcome, HorovodSparseError):
            if self._decompressed < len(self._recorded):
                return self._recorded[ctx.index].tensor  # p.grad (see the module's note)
            if self._optimizer is not None:
                release_pending(self._optimizer)
            raise self._outcome
        return self._outcome[ctx.index]

    def _forget_steps(self):
        if self._optimizer is not None:
            release_pending(self._optimizer)
        self._parameters = self._positions = self._optimizer = None
        self._by_gradient, self._recorded, self._outcome, self._decompressed = {}, [], None, 0
        self._whole, self._whole_results = None, []

    # -- dense fallback steps through Horovod's own allreduce (core.fallback) --------
    def _whole_step_begins(self):
        """Whether this step is a dense fallback step whose gradients Horovod's own
        allreduce carries, each as the backward pass produces it (then begin it):
        ``"whole"`` (each sends gradient plus residual, written by the exchange),
        ``"plain"`` (the residual is empty and no velocity moves: each sends itself,
        as ``hvd.Compression.none`` does), ``"momentum"`` (the same, the ranks
        sharing one velocity: ``GradientExchange.begin_plain_step``) or ``None``
        (a step of the exchange)."""
        if self.layout is None or self._optimizer is None:
            return None  # the exchange begins the step itself
        exchange = self.gradient_exchange
        if exchange.begin_step() != "dense" or self.sparsifier.clip_norm is not None:
            return None  # local clipping needs the whole gradient: DenseStep in the exchange
        self.guard()
        self._whole_results, self._plain_finite = [], True
        if not self.owns_momentum and exchange.begin_plain_step(self.layout):
            return "plain"
        if self._whole_index[0] is not self.layout:  # once per layout
            self._whole_index = (self.layout,
                                 {name: i for i, name in enumerate(self.layout.names)})
        index = self._whole_index[1]
        held = tuple(index[name] for name, p in self._parameters
                     if name in index and not p.requires_grad)
        like = next(p for _, p in self._parameters if p.is_floating_point())
        if exchange.begin_whole_step(self.layout, held, like):
            return "whole"
        return "momentum"  # a plain step after all: only a shared velocity makes one here

    def _send_whole(self, gradient):
        position = self._whole_index[1][gradient.name]
        flat = gradient.tensor.detach().reshape(-1)
        sent = self.gradient_exchange.whole_gradient(position, flat)
        return sent.view(gradient.tensor.shape)

    def _whole_result(self, tensor, ctx):
        """Horovod's allreduce wrote the result into the output buffer (``tensor`` is
        its slice); the last one ends the step."""
        gradient = self._recorded[ctx.index].tensor
        result = tensor.view(gradient.shape).to(gradient.dtype)
        self._whole_results.append(result)
        if len(self._whole_results) == len(self._recorded):
            self._end_whole_step(finite=None)  # the exchange checks its output buffer
        return result

    def _plain_result(self, tensor, position):
        """Horovod's allreduce of a gradient as it is (in place; at a layout
        ``position``, the exchange applies momentum to it); the last one ends the
        step.  Kept to a list append: on a small model a few hundred microseconds a
        step cost a whole Horovod cycle (``HOROVOD_CYCLE_TIME``)."""
        exchange = self.gradient_exchange
        if position is None:
            finite = exchange.ops.all_finite(tensor)
        else:
            flat = tensor.reshape(-1)
            finite = exchange.plain_gradient(position, flat)
            if flat.data_ptr() != tensor.data_ptr():  # a strided gradient: reshape copied
                tensor.copy_(flat.view(tensor.shape))
        results = self._whole_results
        results.append(tensor)
        self._plain_finite = self._plain_finite and finite
        if len(results) == len(self._recorded):
            self._end_whole_step(self._plain_finite)
        return tensor

    def _end_whole_step(self, finite):
        self._whole, self._outcome = None, []
        exchange = self.gradient_exchange
        try:
            exchange.end_whole_step(finite)
        except HorovodSparseError:  # non-finite under "raise": alike on every rank
            release_pending(self._optimizer)
            raise
        if exchange.metrics.skipped and exchange.nonfinite == "skip":
            for returned in self._whole_results:  # copies, where the dtype differs
                returned.zero_()

    # -- which gradient is this? ------------------------------------------------
    def _identify(self, tensor, caller):
        """The :class:`_Gradient` of ``tensor``; ``caller``: :func:`horovod_caller`'s answer."""
        if self._parameters is None:
            self._first_step(caller[0] if caller else None)
        if caller is not None:
            parameter = caller[1]
            if parameter not in self._positions:
                raise ValueError("a gradient handed to compress() belongs to none of the "
                                 "parameters of the optimizer this compressor was first used with: "
                                 "use one compressor per DistributedOptimizer")
            position = self._positions[parameter]
            return _Gradient(self._parameters[position][0], position, tensor,
                             held=not parameter.requires_grad)
        if not self._parameters:
            return _Gradient(f"grad.{len(self._recorded)}", len(self._recorded), tensor)
        position = self._position_of_gradient(tensor)
        return _Gradient(self._parameters[position][0], position, tensor)

    def _position_of_gradient(self, tensor):
        """Outside an optimizer: the named parameter whose ``.grad`` is ``tensor``
        (a lookup table rebuilt when gradients were replaced: O(1) amortized)."""
        position = self._by_gradient.get(id(tensor))
        if position is None or self._parameters[position][1].grad is not tensor:
            self._by_gradient = {id(p.grad): i for i, (_, p) in enumerate(self._parameters)
                                 if p.grad is not None}
            position = self._by_gradient.get(id(tensor))
            if position is None:
                raise ValueError("a gradient handed to compress() belongs to none of the "
                                 "named_parameters given to the compressor")
        return position

    def _first_step(self, optimizer):
        """Fix names and order; with Horovod's optimizer, check it and the model on every
        rank before this rank submits anything to Horovod.  The parameters are kept
        only once every check has passed: after a caught error the next ``compress``
        runs the first step again (not a half-made one)."""
        named = list(self._named_parameters) if self._named_parameters is not None else []
        if optimizer is None:
            if self._named_parameters is not None and not named:
                raise ValueError("named_parameters given to the compressor is empty (a "
                                 "generator consumed elsewhere?): pass "
                                 "list(model.named_parameters())")
            if self.check_every and not named:
                raise ValueError("check_every needs named_parameters when the compressor is "
                                 "used outside hvd.DistributedOptimizer")
            parameters = named
        else:
            reduction = reduction_of(optimizer.op, hvd)
            self._check_momentum(optimizer)
            self.adopt_process_set(optimizer.process_set)
            own_names = {p: name for name, p in named}
            parameters = [(own_names.get(p, name), p) for name, p in trained_parameters(optimizer)]
            self.reduction = reduction
            compressed = [(name, p) for name, p in parameters if p.is_floating_point() and p.numel()]
            self.check_agreement(Layout(names=tuple(name for name, _ in compressed),
                                        shapes=tuple(tuple(p.shape) for _, p in compressed),
                                        dtypes=tuple(str(p.dtype) for _, p in compressed)))
            self._optimizer = optimizer
        self._parameters = parameters
        self._positions = {p: i for i, (_, p) in enumerate(parameters)}

    def _check_momentum(self, optimizer):
        momentum = self.sparsifier.momentum
        if getattr(optimizer, "momentum_on_weight_decay_only", False):  # DGCSGD
            if not momentum:
                raise ValueError(
                    f"{type(optimizer).__name__}'s momentum moves the weight decay only and leaves "
                    f"the gradient's to the compressor, but {self.sparsifier.name} keeps none "
                    "(momentum=0): the gradient would get no momentum.  Use torch.optim.SGD, or "
                    "dgc with momentum > 0")
            return
        theirs = sorted({group["momentum"] for group in optimizer.param_groups
                         if group.get("momentum")})
        if momentum and theirs:
            raise ValueError(
                f"{self.sparsifier.name} applies momentum correction itself (momentum={momentum}) "
                f"and the optimizer adds momentum too (momentum={theirs[0]}): momentum would count "
                f"twice.  Use the optimizer without momentum, or {self.sparsifier.name}"
                "(momentum=0.0) to keep the optimizer's")

    # -- the step ---------------------------------------------------------------
    def _ops(self):
        return TorchOps()

    def _communicator(self):
        return HorovodTorchCommunicator(self._process_set)

    def _reduce_step(self):
        if self._optimizer is not None:
            self._refuse_sparse_gradients()
        self.guard()
        recorded = self._recorded
        order = sorted(range(len(recorded)), key=lambda i: recorded[i].position)
        layout = Layout(names=tuple(recorded[i].name for i in order),
                        shapes=tuple(tuple(recorded[i].tensor.shape) for i in order),
                        dtypes=tuple(str(recorded[i].tensor.dtype) for i in order))
        held = tuple(j for j, i in enumerate(order) if recorded[i].held)
        flat = self.reduce([recorded[i].tensor.detach().reshape(-1) for i in order], layout, held)
        aggregates = [None] * len(recorded)
        for i, (start, stop) in zip(order, self.output_bounds):
            tensor = recorded[i].tensor
            aggregates[i] = flat[start:stop].view(tensor.shape).to(tensor.dtype)
        return aggregates

    def _check_parameters(self):
        check_identical(*_names_and_bytes(self._parameters), self.comm)

    def _refuse_sparse_gradients(self):
        """A sparse ``p.grad`` reaches ``compress`` densified under ``sparse_as_dense``
        (Horovod's ``to_dense()`` copy), else it would be exchanged sparsely: refused."""
        if self._optimizer.sparse_as_dense:
            return
        sparse = [name for name, p in self._parameters if p.grad is not None and p.grad.is_sparse]
        if sparse:
            raise TypeError(f"parameter(s) {sparse} have sparse gradients (e.g. "
                            "torch.nn.Embedding(sparse=True)); horovod_sparse exchanges dense "
                            "gradients: pass sparse_as_dense=True to hvd.DistributedOptimizer, or "
                            "use a dense embedding")


def check_parameters(named_parameters, process_set=None):
    """The consistency guard: raise :class:`~horovod_sparse.core.ParameterDivergenceError`
    on every rank unless all ranks of ``process_set`` (default: all) hold
    bit-identical ``named_parameters``."""
    check_identical(*_names_and_bytes(named_parameters), HorovodTorchCommunicator(process_set))


def _names_and_bytes(named_parameters):
    named = list(named_parameters)
    return ([name for name, _ in named],
            [p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy() for _, p in named])


@method_factories
class Compression:
    """Factories, used like Horovod's ``hvd.Compression.fp16``::

        opt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(),
            compression=horovod_sparse.torch.Compression.exdyna(density=0.001))

    Every factory takes ``density`` and the method's hyper-parameters, plus
    the optional ``named_parameters``, ``nonfinite``, ``process_set``,
    ``check_every``, ``dense_below``, ``dense_1d`` and ``fallback`` (see
    :class:`SparseCompressor`).
    """

    @staticmethod
    def create(name, named_parameters=None, nonfinite="raise", process_set=None, check_every=None,
               dense_below=None, dense_1d=False, fallback=None, **hyperparameters):
        return SparseCompressor(create(name, **hyperparameters), named_parameters=named_parameters,
                                nonfinite=nonfinite, process_set=process_set,
                                check_every=check_every, dense_below=dense_below,
                                dense_1d=dense_1d, fallback=fallback)


__all__ = ["Compression", "SparseCompressor", "check_parameters"]
