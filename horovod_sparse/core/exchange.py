"""The per-step driver: error feedback, one sparsifier, consistency checks and metrics.

A :class:`GradientExchange` is the state object of one model's sparse
gradient exchange (in the spirit of PyTorch's PowerSGD hook state): the
framework adapters hand it the step's flat gradients, it returns the averaged
(or, with ``reduction="sum"``, summed) sparse aggregate, identical on every
rank::

    acc     = grads + residual                       (error feedback)
    agg     = sparsifier.exchange(acc)               (select + collectives)
    residual = acc with the communicated coordinates zeroed

The protocol's one rule: before any payload the ranks swap a small header
``[layout fingerprint, configuration fingerprint, non-finite flag, fields...]``.
Every rank sees the whole table, so a model or configuration mismatch or a
NaN/Inf gradient raises the same error on all ranks instead of hanging or
corrupting state.  :class:`StepContext` enforces the rule: it is the
sparsifier's only way to the ranks, and a payload collective asked for before
the header raises.
"""

import collections
import hashlib
import math
import time

import numpy as np

from .dense_part import DensePart, Split, dense_positions
from .errors import ConfigurationMismatchError, ModelMismatchError, NonFiniteGradientError
from .fallback import DenseStep, create_fallback
from .feedback import ErrorFeedback
from .metrics import StepMetrics
from .arguments import check_bool, check_integer

NONFINITE_POLICIES = ("raise", "skip", "propagate")
REDUCTIONS = ("average", "sum")
DENSE_STEP = DenseStep()
INT32_POSITIONS = 2 ** 31  # flat models up to this many elements send int32 indices


def wire_dtype(layout):
    """The dtype gradient values travel in: ``"float16"`` when every gradient is
    float16, else ``"float32"`` (bfloat16 too: Horovod 0.28 cannot sum bfloat16
    on CPU).  Selection and accumulation are always float32."""
    names = {str(dtype).rsplit(".", 1)[-1] for dtype in layout.dtypes}
    return "float16" if names == {"float16"} else "float32"


def fingerprint(text):
    """A 63-bit digest of ``text`` (non-negative, fits the int64 header)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class StepContext:
    """One step of one sparsifier: ops, layout, step number, and the ranks.

    The context is the sparsifier's only way to the other ranks.  Its first
    collective must be :meth:`exchange_header`; every other collective asked
    for before it raises ``RuntimeError``, and so does :meth:`new_aggregate`:
    the step's output buffer is the old residual's storage
    (``ErrorFeedback.output``), free only once the step can no longer be
    refused.  Collectives are timed and metered
    by the communicator; the ``*_values`` and ``*_indices`` forms apply the
    wire formats (values in :attr:`wire_dtype`, indices as int32 unless the
    model has more than ``2**31`` elements).
    """

    def __init__(self, ops, comm, layout, step, configuration, finite, feedback,
                 reduction="average", model=None):
        self.ops, self.layout, self.step = ops, layout, step
        self.model = layout if model is None else model  # checked in the header
        self.wire_dtype = wire_dtype(self.model)
        self.configuration, self.finite, self.reduction = configuration, finite, reduction
        self._comm = comm
        self._aggregate = None
        self._feedback = feedback
        self._header_exchanged = False
        self.selection_time = 0.0

    @property
    def rank(self):
        return self._comm.rank

    @property
    def size(self):
        return self._comm.size

    def new_aggregate(self):
        """This step's dense output buffer, zeroed (after the header only)."""
        self._payload()
        if self._aggregate is None:
            self._aggregate = self._feedback.output()
        else:
            self.ops.fill_zero(self._aggregate)
        return self._aggregate

    def clear(self, indices):
        """Error feedback: zero the communicated ``indices`` in this step's ``acc``
        (and in the velocity under momentum correction); with a float16 wire,
        keep the rounding error there instead."""
        self._feedback.clear(indices, self.wire_dtype)

    def flush(self):
        """Error feedback after sending every coordinate: the residual is empty
        (but for float16 rounding), the velocity is kept."""
        self._feedback.flush(self.wire_dtype)

    def reduced(self, summed):
        """The ranks' ``summed`` values as the step's reduction: divided by ``P``
        (``"average"``, Horovod's default) or as they are (``"sum"``, ``op=hvd.Sum``)."""
        return self.ops.divide(summed, self.size) if self.reduction == "average" else summed

    def timed_selection(self):
        return _Stopwatch(self)

    def scanned(self, start, stop, threshold):
        """The ``(indices, values)`` of ``|acc_i| >= threshold`` over ``[start, stop)``
        when the sparsifier's :meth:`~.methods.base.Sparsifier.scan_request` asked
        for exactly that scan (collected while ``acc`` was formed), else ``None``."""
        return self._feedback.scanned(start, stop, threshold)

    # -- the header ---------------------------------------------------------------
    def exchange_header(self, *fields):
        """Allgather ``[layout fp, configuration fp, non-finite, *fields]``; check it
        on every rank.  Returns every rank's ``fields``: int64, shape
        ``(P, len(fields))``."""
        if self._header_exchanged:
            raise RuntimeError("the step's header was already exchanged")
        table = self._comm.allgather_host(header_row(self.model, self.configuration,
                                                     self.finite, fields))
        self._header_exchanged = True
        return check_header(table, self.rank, self.model, self.configuration, self.step)

    # -- payload collectives (after the header) -------------------------------------
    def _payload(self):
        if not self._header_exchanged:
            raise RuntimeError("a payload collective before the step's header: a sparsifier "
                               "must call context.exchange_header() first")
        return self._comm

    def allgather(self, x, counts):
        return self._payload().allgather(x, counts)

    def allreduce_sum(self, x):
        return self._payload().allreduce_sum(x)

    def broadcast(self, x, root):
        return self._payload().broadcast(x, root)

    def alltoall(self, x, splits):
        return self._payload().alltoall(x, splits)

    def allgather_host(self, array):
        return self._payload().allgather_host(array)

    def broadcast_host(self, array, root):
        return self._payload().broadcast_host(array, root)

    # -- wire formats -----------------------------------------------------------
    def allgather_values(self, values, counts):
        return self._from_wire(self.allgather(self._to_wire(values), counts))

    def allreduce_values(self, values):
        return self._from_wire(self.allreduce_sum(self._to_wire(values)))

    def alltoall_values(self, values, splits):
        received, received_splits = self.alltoall(self._to_wire(values), splits)
        return self._from_wire(received), received_splits

    def allgather_indices(self, indices, counts):
        return self._widen(self.allgather(self._narrow(indices), counts))

    def broadcast_indices(self, indices, root):
        return self._widen(self.broadcast(self._narrow(indices), root))

    def alltoall_indices(self, indices, splits):
        received, received_splits = self.alltoall(self._narrow(indices), splits)
        return self._widen(received), received_splits

    @property
    def narrow_indices(self):
        """Whether indices travel as int32 (every position below ``2**31``)."""
        return self.model.n <= INT32_POSITIONS

    def _to_wire(self, values):
        return values if self.wire_dtype == "float32" else self.ops.astype(values, self.wire_dtype)

    def _from_wire(self, values):
        return values if self.wire_dtype == "float32" else self.ops.astype(values, "float32")

    def _narrow(self, indices):
        return self.ops.astype(indices, "int32") if self.narrow_indices else indices

    def _widen(self, indices):
        return self.ops.astype(indices, "int64") if self.narrow_indices else indices


def header_row(layout, configuration, finite, fields=()):
    """This rank's header: ``[layout fp, configuration fp, non-finite, *fields]`` (int64)."""
    return np.array([layout.fingerprint, fingerprint(configuration), 0 if finite else 1, *fields],
                    dtype=np.int64)


def check_header(table, rank, layout, configuration, step):
    """Raise the same error on every rank if any rank's header differs in model or
    configuration or flags a non-finite gradient; else return every rank's fields."""
    own = header_row(layout, configuration, True)
    differing = np.flatnonzero(table[:, 0] != own[0])
    if differing.size:
        raise ModelMismatchError(
            f"rank {rank}'s model ({layout.describe()}) differs from rank(s) "
            f"{differing.tolist()}: every rank must pass the same parameters, in the same "
            "order, with the same shapes and dtypes")
    differing = np.flatnonzero(table[:, 1] != own[1])
    if differing.size:
        raise ConfigurationMismatchError(rank, configuration, differing.tolist())
    bad = np.flatnonzero(table[:, 2])
    if bad.size:
        raise NonFiniteGradientError(bad.tolist(), step)
    return table[:, 3:]


def agree(comm, layout, configuration):
    """The header's model and configuration checks outside a step (collective)."""
    check_header(comm.allgather_host(header_row(layout, configuration, True)), comm.rank, layout,
                 configuration, step=None)


class _Stopwatch:
    def __init__(self, context):
        self.context = context

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.context.selection_time += time.perf_counter() - self.start


class GradientExchange:
    """Sparse, error-feedback gradient averaging of one model across ranks.

    Parameters
    ----------
    sparsifier : a ``core.methods`` object (``create(name, **kw)`` builds one).
    ops : ``ArrayOps`` of the gradients' framework.
    comm : ``Communicator`` of the ranks.
    nonfinite : what a NaN/Inf gradient on any rank does, on every rank alike;
        in all cases the residuals stay exactly as before the step:

        * ``"raise"`` (default): :class:`NonFiniteGradientError`;
        * ``"skip"``: the step returns a zero gradient;
        * ``"propagate"``: the step returns NaN everywhere, as a dense
          allreduce carries a NaN/Inf to every rank -- the policy for
          ``torch.amp.GradScaler``, which then skips the step and lowers its
          scale on every rank.
    reduction : ``"average"`` (default) or ``"sum"`` over the ranks.
    dense_below, dense_1d : gradients with fewer than ``dense_below`` elements
        (``None``: none), and with ``dense_1d`` every one-dimensional gradient,
        are averaged exactly by one allreduce in the same step instead of
        sparsified (see ``core.dense_part``).
    fallback : ``None`` (default: always the method) or ``"auto"``: time sparse
        and dense steps and run the faster (see ``core.fallback``).
    history_size : how many steps of ``StepMetrics`` ``history`` keeps (the
        newest; 1,000 by default), so a long run's memory does not grow.
    """

    def __init__(self, sparsifier, ops, comm, nonfinite="raise", reduction="average",
                 dense_below=None, dense_1d=False, fallback=None, history_size=1000):
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.sparsifier, self.ops, self.comm = sparsifier, ops, comm
        self.nonfinite, self.reduction = nonfinite, reduction
        self.dense_below = check_integer("dense_below", dense_below, allow_none=True)
        self.dense_1d = check_bool("dense_1d", dense_1d)
        self.fallback_option, self.fallback = fallback, create_fallback(fallback)
        self._started = None  # when the last step started (fallback="auto" times periods)
        self._begun = None    # the step_count begin_step last started
        self._whole = None    # the dense step in flight, while the framework allreduces it
        self._flushed = False  # the residual is known to be empty (after a dense step) ...
        self._emptied = False  # ... every gradient's (none was held in that step)
        self._shared = False   # the velocities are the ranks' mean (see begin_plain_step)
        self._plain_layout = (None, False)  # (layout, whether it travels in its own dtypes)
        self.feedback = ErrorFeedback(ops, sparsifier.momentum, sparsifier.nesterov)
        self.dense = DensePart(ops, sparsifier.momentum, sparsifier.nesterov)
        self._split = None
        self.step_count = 0
        self.history = collections.deque(maxlen=history_size)

    @property
    def configuration(self):
        """What every rank must agree on besides the model (checked in the header)."""
        return configuration(self.sparsifier, self.nonfinite, self.reduction, self.dense_below,
                             self.dense_1d, self.fallback_option)

    def split(self, layout):
        """``layout`` split into the sparsified and the dense gradients (see
        ``core.dense_part``); its ``output_bounds`` locate each gradient in a step's output."""
        if self._split is None or self._split.layout != layout:
            self._split = Split(layout, dense_positions(layout, self.dense_below,
                                                        self.dense_1d or self.sparsifier.dense_1d))
        return self._split

    @property
    def metrics(self):
        """Metrics of the last step (``None`` before the first)."""
        return self.history[-1] if self.history else None

    def step(self, grads, layout, held=()):
        """Average the flat gradients ``grads`` (one per layout entry) sparsely.

        ``held``: positions in ``layout`` of gradients absent this step (a
        frozen parameter, a variable without a gradient); their ``grads``
        entries are not read (``None`` will do), nothing of them is sent, the aggregate holds
        zeros there (when every rank holds them) and their residuals are
        kept until they have a gradient again.

        Returns the flat aggregate (``layout.n`` elements; gradient ``i`` at
        ``split(layout).output_bounds[i]``, which is ``layout.bounds[i]`` unless
        some gradients are sent densely).  It lives in a buffer of the error
        feedback's (``core.feedback``): valid until the next step (copy it to keep
        it longer), and the gradients handed to that step may be views of it.
        """
        started = time.perf_counter()
        kind = self.begin_step()
        self._flushed = self._emptied = self._shared = False
        split = self.split(layout)
        sparse = split.sparse_layout
        self.comm.reset_traffic()
        like = next(grad for i, grad in enumerate(grads) if i not in held)
        self.feedback.begin(sparse, split.held_in(split.sparse, held), like, layout.n)
        acc, dense, finite = self._gather(split, grads, held, like, kind)
        context = StepContext(self.ops, self.comm, sparse, self.step_count, self.configuration,
                              finite=finite, feedback=self.feedback,
                              reduction=self.reduction, model=layout)
        method = DENSE_STEP if kind == "dense" else self.sparsifier
        try:
            if sparse.n:
                aggregate, metrics = method.exchange(acc, context)
            else:  # every gradient dense: the header still comes first
                context.exchange_header()
                aggregate = context.new_aggregate()
                metrics = StepMetrics(step=self.step_count, n=0, k=0, counts=[0] * self.comm.size,
                                      nnz=0)
            if dense is not None:
                self.ops.add_slice(aggregate, aggregate,
                                   context.reduced(context.allreduce_values(dense)),
                                   sparse.n, layout.n)
        except NonFiniteGradientError:
            if self.nonfinite == "raise":
                raise
            aggregate = self.feedback.spare_output()  # the residual stays
            self.ops.fill_zero(aggregate)
            if self.nonfinite == "propagate":  # aggregate = 0 + NaN everywhere
                self.ops.add_slice(aggregate, aggregate, math.nan, 0, layout.n)
            metrics = StepMetrics(step=self.step_count, n=sparse.n,
                                  k=self.sparsifier.k(sparse.n) if sparse.n else 0,
                                  counts=[0] * self.comm.size, nnz=0, skipped=True)
        else:
            if sparse.n:
                self.feedback.commit()
            self.dense.commit()
            if kind == "dense" and wire_dtype(layout) == "float32":
                self._flushed, self._emptied = True, not held
        traffic = self.comm.traffic.totals()
        metrics.dense = 0 if metrics.skipped else layout.n - sparse.n
        metrics.elements_sent = traffic["elements_sent"]
        metrics.elements_received = traffic["elements_received"]
        metrics.bytes_sent = traffic["bytes_sent"]
        metrics.bytes_received = traffic["bytes_received"]
        metrics.selection_time = context.selection_time
        metrics.communication_time = traffic["seconds"]
        metrics.rounds = traffic["rounds"]
        metrics.total_time = time.perf_counter() - started
        self.history.append(metrics)
        self.step_count += 1
        return aggregate

    # -- fallback="auto" (core.fallback) ----------------------------------------------
    def begin_step(self):
        """Start step :attr:`step_count` (again: no effect) and return its kind,
        ``"sparse"`` or ``"dense"``.  Under ``fallback="auto"`` the last step's
        period goes to the fallback's timing, and at a decision the ranks agree
        (one allreduce of two numbers, so every rank calls this at the same
        point of the step: the adapter at the step's first gradient, else
        :meth:`step`)."""
        fallback = self.fallback
        if fallback is None:
            return "sparse"
        if self._begun != self.step_count:
            self._begun, now = self.step_count, time.perf_counter()
            report = fallback.begin_step(None if self._started is None else now - self._started)
            self._started = now
            if report is not None:
                fallback.decide(self.comm.allreduce_host(report), self.comm.size)
        return fallback.kind

    def begin_whole_step(self, layout, held, like):
        """Start a dense step whose gradients the framework allreduces itself, one by one
        as they come (PyTorch: Horovod's own allreduce, overlapped with the backward
        pass): :meth:`whole_gradient` gives what each sends, :meth:`end_whole_step`
        ends it.  ``held``: as in :meth:`step` (they send zeros).

        Returns ``False`` when there is nothing to add -- the residual is empty
        after an earlier whole step and no velocity moves: the framework then
        sends the gradients as they are (a plain dense step) and
        :meth:`whole_gradient` is not called."""
        if self.begin_plain_step(layout, held, like):
            return False
        split = self.split(layout)
        self._begin_velocities(split, held, like)
        aggregate = self.feedback.spare_output()  # where the gradients may lie: see whole_gradient
        for position in held:  # held gradients send zeros
            start, stop = split.output_bounds[position]
            self.ops.fill_zero(aggregate[start:stop])
        self._whole = (split, aggregate, frozenset(held))
        return True

    def begin_plain_step(self, layout, held=(), like=None):
        """Start a *plain* dense step if there is nothing to add to the gradients
        (the residual is empty after an earlier dense step, every gradient's dtype
        is the wire dtype, and no velocity moves or the velocities are shared):
        the framework sends them as they are, and :meth:`end_whole_step` ends the
        step.  Returns whether it started one; a held gradient sends what the
        framework hands it, as ``hvd.Compression.none`` would.

        Under momentum correction (averaged, without Nesterov) a whole step that
        starts with an empty residual sends the velocities ``u_r = m u_r + g_r``
        alone, so its aggregate is their mean ``U``, and every rank adopts it
        (:meth:`_whole_step_done`).  From then on ``U = m U + mean(g)``: the
        gradients travel as they are and :meth:`plain_gradient` applies the
        momentum to each result -- momentum SGD, as Horovod's dense users run it.
        A sparse step resumes with every rank's velocity at ``U``: their mean,
        all the aggregate sees, is unchanged."""
        if not self._flushed or (self.sparsifier.momentum and not self._shared):
            return False
        if self._plain_layout[0] is not layout:  # bfloat16, mixed float16: whole steps
            wire = wire_dtype(layout)
            self._plain_layout = (layout, all(str(dtype).rsplit(".", 1)[-1] == wire
                                              for dtype in layout.dtypes))
        if not self._plain_layout[1]:
            return False
        split = self.split(layout)
        if self.sparsifier.momentum:
            self._begin_velocities(split, held, like)
        self._whole = (split, None, frozenset(held))
        return True

    def _begin_velocities(self, split, held, like):
        self.feedback.begin(split.sparse_layout, split.held_in(split.sparse, held), like,
                            split.layout.n)
        self.dense.begin_whole(split.dense_layout, split.held_in(split.dense, held), like)

    @property
    def _velocities_shareable(self):
        """Whether a dense step's aggregate can be the ranks' velocity (see
        :meth:`begin_plain_step`): momentum correction, averaged, without Nesterov."""
        return (bool(self.sparsifier.momentum) and not self.sparsifier.nesterov
                and self.reduction == "average")

    def _velocity_at(self, split, start):
        """``(velocity buffer, offset)`` of the gradient at ``start`` of the output."""
        n_sparse = split.sparse_layout.n
        if start < n_sparse:
            return self.feedback.velocity_buffer, 0
        return self.dense.velocity_buffer, n_sparse

    def _whole_step_done(self, split, aggregate, held):
        """A whole step went through (its ``aggregate`` finite): the residual is empty,
        but a held gradient's.  If every gradient's was empty at the step's start,
        none is held and the velocities are shareable, ``aggregate`` is the ranks'
        mean velocity: every rank adopts it.  (A held gradient keeps its own residual
        and velocity, which differ between the ranks: no sharing then.  ``held``
        is the frozen parameters, alike on every rank; the exchange's own dense
        step never shares, as TensorFlow's held variables -- no gradient this step
        -- may differ between the ranks.)"""
        emptied, self._flushed, self._emptied = self._emptied, True, not held
        if not (emptied and not held and self._velocities_shareable
                and wire_dtype(split.layout) == "float32"):
            return
        for start, stop in split.output_bounds:
            velocity, offset = self._velocity_at(split, start)
            velocity.adopt(self.ops, aggregate[offset:], start - offset, stop - offset)
        self._shared = True

    def plain_gradient(self, position, result):
        """A plain step's averaged gradient ``position`` (flat, in place): with shared
        velocities ``U = m U + result`` and ``result = U`` (:meth:`begin_plain_step`).
        Returns whether ``result`` is finite (under momentum checked in the same pass)."""
        split, _, held = self._whole
        if not self.sparsifier.momentum or position in held:
            return self.ops.all_finite(result)
        start, stop = split.output_bounds[position]
        velocity, offset = self._velocity_at(split, start)
        return velocity.momentum_step(self.ops, self.sparsifier.momentum, result, start - offset,
                                      stop - offset)

    def whole_gradient(self, position, grad):
        """Write what gradient ``position`` of the layout sends in a whole step -- the
        gradient plus its residual (with momentum correction: the new velocity plus
        the residual; Nesterov: ``m u + g`` plus the residual) -- into the step's
        output buffer, and return that slice; the framework allreduces it in place.
        ``grad`` may be a view of that very slice (the last step's output, under
        PyTorch's ``zero_grad(set_to_none=False)``), never of another gradient's."""
        split, aggregate, held = self._whole
        start, stop = split.output_bounds[position]
        if position not in held:
            n_sparse = split.sparse_layout.n
            if start < n_sparse:
                self.feedback.whole_slice(aggregate, grad, start, stop)
            else:
                self.dense.whole_slice(aggregate[n_sparse:], grad, start - n_sparse,
                                       stop - n_sparse)
        return aggregate[start:stop]

    def end_whole_step(self, finite=None):
        """After the framework's allreduce of every gradient (in place, in the output
        buffer; ``finite``: whether the results are, for a plain dense step).  A
        finite result -- the same on every rank: it is a sum -- empties the
        residual and keeps the new velocities (a plain step's: ``U``, see
        :meth:`begin_plain_step`); otherwise the non-finite policy
        applies as in :meth:`step` (``"skip"`` zeroes the output buffer; the
        framework zeroes a plain step's results) and the state stays as before."""
        split, aggregate, held = self._whole
        self._whole = None
        if aggregate is not None:
            finite = self.ops.all_finite(aggregate)
        n = split.sparse_layout.n
        metrics = StepMetrics(step=self.step_count, n=n, k=n, counts=[n] * self.comm.size,
                              nnz=n, dense=split.layout.n - n, extra={"fallback": True})
        if not finite:
            if self.nonfinite == "raise":
                raise NonFiniteGradientError(None, self.step_count)
            metrics.skipped, metrics.nnz, metrics.dense = True, 0, 0
            if self.nonfinite == "skip" and aggregate is not None:
                self.ops.fill_zero(aggregate)
        elif aggregate is not None:
            self.feedback.end_whole()
            self.dense.commit()
            self._whole_step_done(split, aggregate, held)
        elif self.sparsifier.momentum:  # a plain step: the residual stays empty
            self.feedback.commit_velocity()
            self.dense.commit()
        metrics.elements_sent = metrics.elements_received = split.layout.n
        metrics.bytes_sent = metrics.bytes_received = 4 * split.layout.n
        self.history.append(metrics)
        self.step_count += 1

    def _gather(self, split, grads, held, like, kind):
        """``(acc, dense, all finite)``: error feedback over the sparsified gradients
        (``acc``, ``None`` when there are none; in the same pass, the scan the
        sparsifier asks for on a ``kind="sparse"`` step) and the dense part's
        vector (``None`` when there is none), both of one clipping scale."""
        scale = self._clip_scale(grads, split.layout, held)
        acc, finite = None, True
        n_sparse = split.sparse_layout.n
        if n_sparse:
            scan = None
            if kind == "sparse" and not self.feedback.momentum:
                scan = self.sparsifier.scan_request(n_sparse, self.comm.rank, self.comm.size,
                                                    self.step_count)
            acc = self.feedback.accumulate([grads[i] for i in split.sparse], scale, scan)
            finite = self.feedback.finite
            if finite is None:
                finite = self.ops.all_finite(acc)
        if not split.dense:
            self.dense.refuse_pending(split.dense_layout)
            return acc, None, finite
        dense, dense_finite = self.dense.gather([grads[i] for i in split.dense],
                                                split.dense_layout, like,
                                                split.held_in(split.dense, held), scale)
        return acc, dense, finite and dense_finite

    def _clip_scale(self, grads, layout, held):
        """DGC's local gradient clipping: scale so ``||g|| <= clip_norm / sqrt(P)``
        (``None`` when the sparsifier does not clip or the norm is already below)."""
        clip_norm = self.sparsifier.clip_norm
        if clip_norm is None:
            return None
        norm = math.sqrt(math.fsum(float(self.ops.segment_sq_norms(g, [(0, size)])[0])
                                   for i, (g, size) in enumerate(zip(grads, layout.sizes))
                                   if i not in held))
        coefficient = clip_norm / math.sqrt(self.comm.size) / (norm + 1e-6)
        return coefficient if coefficient < 1 else None

    def state_dict(self, layout):
        """Step, residuals (and velocities) by gradient name, sparsifier state; before
        the first step (``layout`` ``None``) what was loaded, as it was loaded."""
        split = None if layout is None else self.split(layout)
        return {"step": self.step_count,
                **self.feedback.state_dict(split and split.sparse_layout),
                **self.dense.state_dict(split and split.dense_layout),
                "sparsifier": self.sparsifier.state_dict()}

    def load_state_dict(self, state):
        self._flushed = self._emptied = self._shared = False
        self.step_count = int(state["step"])
        self.feedback.load_state_dict(state)
        self.dense.load_state_dict(state)
        if "sparsifier" in state:  # absent when carried over to another rank count
            self.sparsifier.load_state_dict(state["sparsifier"])


def configuration(sparsifier, nonfinite, reduction, dense_below=None, dense_1d=False,
                  fallback=None):
    """The text every rank's configuration fingerprint is taken of: the method with
    its hyper-parameters (its ``repr``), the non-finite policy, the reduction and
    which gradients are sent densely."""
    text = f"{sparsifier!r}, nonfinite={nonfinite!r}, reduction={reduction!r}"
    if dense_below is not None or dense_1d:
        text += f", dense_below={dense_below!r}, dense_1d={dense_1d!r}"
    if fallback is not None:
        text += f", fallback={fallback!r}"
    return text
