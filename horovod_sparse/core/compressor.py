"""The framework-agnostic half of a whole-model Horovod compressor.

Horovod's ``Compressor`` sees one gradient at a time; the methods here need
the whole model's gradient.  Both adapters (PyTorch, TensorFlow) collect the
step's gradients from Horovod's ``compress`` calls and hand them, flattened in
a fixed order, to :meth:`WholeModelCompressor.reduce`.  This class owns what
is the same for every framework: the :class:`GradientExchange` (built at the
first step), the check that the model does not change between steps, the
metrics, the state a checkpoint holds (see ``core.checkpoint``), and that
state across elastic restarts (see ``core.elastic``).
"""

import copy

from . import checkpoint, elastic
from .fallback import create_fallback
from .exchange import NONFINITE_POLICIES, GradientExchange, agree, configuration
from .arguments import check_bool, check_integer
from .metrics import summarize
from .registry import available


class WholeModelCompressor:
    """Subclasses provide ``_ops()`` and ``_communicator()`` of their framework,
    and may set ``reduction`` (``"average"`` or ``"sum"``) before the first step.

    ``dense_below`` / ``dense_1d``: gradients with fewer elements (or of one
    dimension) are averaged exactly instead of sparsified (``core.dense_part``).
    ``fallback="auto"``: dense steps where sparse ones are slower (``core.fallback``).
    ``check_every``: the consistency guard's period in steps (``None``: never);
    subclasses call :meth:`guard` before each step's exchange and provide
    ``_check_parameters()``.
    """

    def __init__(self, sparsifier, nonfinite="raise", dense_below=None, dense_1d=False,
                 fallback=None, check_every=None, process_set=None):
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        self.sparsifier = sparsifier
        self._untrained = copy.deepcopy(sparsifier)  # what a world change starts again from
        self._exchange = None
        self.reduction = "average"
        self.check_every = check_integer("check_every", check_every, allow_none=True)
        self.dense_below = check_integer("dense_below", dense_below, allow_none=True)
        self.dense_1d = check_bool("dense_1d", dense_1d)
        create_fallback(fallback)  # checks the value
        self.fallback = fallback
        self._nonfinite = nonfinite
        self._process_set = process_set  # the framework's; None: the caller's, else all ranks
        self._comm = None
        self._snapshot = None        # core.elastic.Snapshot of the last elastic commit
        self.layout = None

    def reduce(self, flat_grads, layout, held=()):
        """Reduce one step's gradients (``flat_grads[i]`` is ``layout`` entry ``i``;
        ``held``: see :meth:`GradientExchange.step`)."""
        if self.layout is None:
            self.layout = layout
        elif layout != self.layout:
            raise ValueError("the gradients exchanged changed between steps (was: "
                             f"{self.layout.describe()}; now: {layout.describe()})")
        return self.gradient_exchange.step(flat_grads, self.layout, held)

    @property
    def output_bounds(self):
        """``(start, stop)`` of each gradient of the layout in :meth:`reduce`'s result."""
        return self.gradient_exchange.split(self.layout).output_bounds

    @property
    def reduction(self):
        """``"average"`` (Horovod's default) or ``"sum"`` (``op=hvd.Sum``) over the ranks."""
        return self._reduction

    @reduction.setter
    def reduction(self, value):
        self._reduction = value
        if self._exchange is not None:
            self._exchange.reduction = value

    @property
    def steps_done(self):
        """Steps exchanged so far (a loaded checkpoint's count included)."""
        return 0 if self._exchange is None else self._exchange.step_count

    def guard(self):
        """The consistency guard: at every ``check_every``-th step, before its
        exchange, raise :class:`~horovod_sparse.core.ParameterDivergenceError` on
        every rank unless all ranks hold bit-identical parameters (collective)."""
        if self.check_every and self.steps_done % self.check_every == 0:
            self._check_parameters()

    @property
    def owns_momentum(self):
        """Whether the method applies momentum itself (DGC, gs-SGD): then the
        optimizer must not (the PyTorch compressor raises if it does)."""
        return bool(self.sparsifier.momentum)

    @property
    def configuration(self):
        """The configuration every rank must share (see ``core.exchange``)."""
        return configuration(self.sparsifier, self._nonfinite, self.reduction, self.dense_below,
                             self.dense_1d, self.fallback)

    def check_agreement(self, layout):
        """Raise on every rank unless all ranks have this ``layout`` and configuration
        (collective)."""
        agree(self.comm, layout, self.configuration)

    @property
    def gradient_exchange(self):
        """The :class:`GradientExchange` (built on first use or when state is loaded;
        it holds loaded residuals until the first step names the gradients)."""
        if self._exchange is None:
            self._exchange = GradientExchange(self.sparsifier, self._ops(), self.comm,
                                              nonfinite=self._nonfinite, reduction=self.reduction,
                                              dense_below=self.dense_below, dense_1d=self.dense_1d,
                                              fallback=self.fallback)
        return self._exchange

    @property
    def comm(self):
        if self._comm is None:
            self._comm = self._communicator()
        return self._comm

    def adopt_process_set(self, theirs):
        """Exchange within ``theirs``, the process set of the Horovod optimizer or tape
        calling ``compress``.  A compressor given another set raises ``ValueError`` (the
        two would wait for different ranks), as does one set up for all ranks before
        its first step (its communicator made by ``state_dict``, ``load_state_dict``
        or an elastic state) when ``theirs`` is narrower."""
        if self._process_set is None and self._comm is None:
            self._process_set = theirs
            return
        ours = self._process_set if self._process_set is not None else self._comm.process_set
        if ours.process_set_id != theirs.process_set_id:
            early = "" if self._process_set is not None else (
                " (it was set up for all ranks before its first step, by state_dict, "
                "load_state_dict or an elastic state)")
            raise ValueError(f"the compressor exchanges within {ours}{early} but Horovod reduces "
                             f"within {theirs}: pass the same process_set to both")

    # -- metrics ----------------------------------------------------------------
    @property
    def history(self):
        """``StepMetrics`` of the steps so far on this rank (the newest 1,000), as a list."""
        return [] if self._exchange is None else list(self._exchange.history)

    def metrics(self):
        """``StepMetrics`` of the last step (``None`` before the first)."""
        return None if self._exchange is None else self._exchange.metrics

    def summary(self, skip_first=0):
        return summarize(self.history, skip_first)

    # -- state ------------------------------------------------------------------
    def state_dict(self, all_ranks=False, timeout=60.0):
        """This rank's step, residuals (by gradient name) and sparsifier state,
        stamped with the ``rank`` and ``size`` it belongs to.

        The residuals are per rank, so a rank's own state resumes only that
        rank (loading it elsewhere raises).  For the usual checkpoint that
        rank 0 alone writes, call ``state_dict(all_ranks=True)`` on **every**
        rank (it is collective) and let rank 0 save the result: it holds every
        rank's state, ``{"ranks": [...]}``, and :meth:`load_state_dict` takes
        it on any number of ranks (``core.checkpoint.localize`` says what a
        new rank count gets).  Called on some ranks only it cannot complete:
        with Horovod PyTorch it raises ``TimeoutError`` after ``timeout``
        seconds; TensorFlow's eager collectives cannot be waited on with a
        deadline, so there it waits.
        """
        own = self._own_state()
        return checkpoint.gather(own, self.comm, timeout) if all_ranks else own

    def load_state_dict(self, state):
        """Resume from ``state`` (this rank's own, or gathered).  In elastic training
        the loaded state is the new starting point: the next sync keeps it."""
        self.follow_world()
        own = checkpoint.localize(state, self.comm.rank, self.comm.size)
        self._snapshot = None
        if "step" not in own:  # the state of a compressor that has not run yet
            self._exchange = None
        else:
            self.gradient_exchange.load_state_dict(own)

    def _own_state(self):
        self.follow_world()
        own = {} if self._exchange is None else self._exchange.state_dict(self.layout)
        own.update(rank=self.comm.rank, size=self.comm.size)
        return own

    # -- elastic training (core.elastic; the framework's state handler calls these) --
    def elastic_begin(self):
        """When the elastic state is built: remember this rank's state (no collective)."""
        self._snapshot = elastic.local_snapshot(self._own_state())

    def elastic_commit(self):
        """At ``state.commit()`` (collective): keep this rank's state and the ranks' mean."""
        self._snapshot = elastic.commit(self._own_state(), self.comm)

    def elastic_restore(self):
        """After a failed step: drop it; :meth:`elastic_sync` follows."""
        self._forget_steps()

    def elastic_sync(self):
        """After an elastic restart (collective over the new world): resume from this
        rank's own committed state, or every rank from the committed mean."""
        snapshot = self._snapshot or elastic.local_snapshot(self._own_state())
        self._forget_world()
        state, snapshot = elastic.resume(snapshot, self.comm)
        self.load_state_dict(state)
        self._snapshot = snapshot

    def follow_world(self):
        """At a step's start: when Horovod runs another world than the last step
        (an elastic restart that did not sync: hosts removed), carry the committed
        state over.  Outside elastic training that raises instead."""
        if self._comm is None:
            return
        world = self._comm.current_world()
        if world != (self._comm.rank, self._comm.size):
            state = elastic.after_shrink(self._snapshot, *world)
            self._forget_world()
            self.load_state_dict(state)
            self._snapshot = elastic.Snapshot(state, state)

    def _forget_world(self):
        """Drop everything tied to the ranks of the last step (communicator, exchange,
        the step in flight); the state to resume from is loaded next."""
        self._comm, self._exchange, self.layout = None, None, None
        self.sparsifier = copy.deepcopy(self._untrained)
        self._forget_steps()

    # -- framework hooks ----------------------------------------------------------
    def _ops(self):
        raise NotImplementedError

    def _communicator(self):
        raise NotImplementedError

    def _check_parameters(self):
        """The consistency guard over the framework's parameters (see :meth:`guard`)."""
        raise NotImplementedError

    def _forget_steps(self):
        """Forget the step in flight and what the first step established."""


def reduction_of(op, horovod):
    """``"average"`` or ``"sum"`` for Horovod's ``op`` (``horovod``: the framework's
    ``horovod.torch`` or ``horovod.tensorflow``); any other op raises ``ValueError``."""
    if op == horovod.Average:
        return "average"
    if op == horovod.Sum:
        return "sum"
    name = "hvd.Adasum" if op == horovod.Adasum else f"op={op!r}"
    raise ValueError(f"horovod_sparse supports op=hvd.Average (the default) and op=hvd.Sum, "
                     f"not {name}: sparse gradients are averaged or summed")


def method_factories(cls):
    """Class decorator for an adapter's ``Compression``: one static factory per
    method, ``Compression.exdyna(density=0.001, **options)``, calling
    ``cls.create(name, density=..., **options)``."""
    for method in available():
        setattr(cls, method, _MethodFactory(cls, method))
    return cls


class _MethodFactory:
    """``Compression.<method>``: call it for a compressor.  Passed to Horovod
    uncalled, its ``compress`` says so instead of an ``AttributeError``."""

    def __init__(self, cls, method):
        self._cls, self.__name__ = cls, method
        self.__doc__ = (f"A compressor running ``{method}`` (hyper-parameters: see "
                        "``horovod_sparse.core.methods`` and docs/methods/).")

    def __call__(self, density=0.001, **options):
        return self._cls.create(self.__name__, density=density, **options)

    def compress(self, tensor):
        raise TypeError(f"compression=Compression.{self.__name__} is the factory, not a "
                        f"compressor: pass compression=Compression.{self.__name__}(density=...)")

    decompress = compress

    def __repr__(self):
        return f"Compression.{self.__name__}"
