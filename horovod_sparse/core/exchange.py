"""The per-step driver: error feedback, one sparsifier, consistency checks and metrics.

A :class:`GradientExchange` is the state object of one model's sparse
gradient exchange (in the spirit of PyTorch's PowerSGD hook state): the
framework adapters hand it the step's flat gradients, it returns the averaged
sparse aggregate, identical on every rank::

    acc     = grads + residual                       (error feedback)
    agg     = sparsifier.exchange(acc)               (select + collectives)
    residual = acc with the communicated coordinates zeroed

Before any payload is exchanged the ranks swap a small header
``[layout fingerprint, non-finite flag, count, extras...]``; every rank sees
the whole table, so a model mismatch or a NaN/Inf gradient raises the same
error on all ranks (or, with ``nonfinite="skip"``, all ranks return a zero
gradient and keep their residuals) instead of hanging or corrupting state.
"""

import collections
import math
import time

import numpy as np

from .errors import ModelMismatchError, NonFiniteGradientError
from .feedback import ErrorFeedback
from .metrics import StepMetrics

NONFINITE_POLICIES = ("raise", "skip")


def wire_dtype(layout):
    """The dtype gradient values travel in: ``"float16"`` when every gradient is
    float16, else ``"float32"`` (bfloat16 too: Horovod 0.28 cannot sum bfloat16
    on CPU).  Selection and accumulation are always float32."""
    names = {str(dtype).rsplit(".", 1)[-1] for dtype in layout.dtypes}
    return "float16" if names == {"float16"} else "float32"


class StepContext:
    """What a sparsifier needs during one exchange: ops, communicator, layout, step."""

    def __init__(self, ops, comm, layout, step, finite, aggregate, feedback):
        self.ops, self.comm, self.layout, self.step = ops, comm, layout, step
        self.wire_dtype = wire_dtype(layout)
        self.finite = finite
        self._aggregate = aggregate
        self._feedback = feedback
        self.selection_time = 0.0
        self.communication_time = 0.0

    @property
    def rank(self):
        return self.comm.rank

    @property
    def size(self):
        return self.comm.size

    def new_aggregate(self):
        """This step's dense output buffer, zeroed."""
        self.ops.fill_zero(self._aggregate)
        return self._aggregate

    def clear(self, indices):
        """Error feedback: zero the communicated ``indices`` in this step's ``acc``
        (and in the velocity under momentum correction); with a float16 wire,
        keep the rounding error there instead."""
        self._feedback.clear(indices, self.wire_dtype)

    def to_wire(self, values):
        """Gradient values as they travel: in :attr:`wire_dtype`."""
        return values if self.wire_dtype == "float32" else self.ops.to_wire(values, self.wire_dtype)

    def from_wire(self, values):
        return values if self.wire_dtype == "float32" else self.ops.from_wire(values)

    def timed_selection(self):
        return _Stopwatch(self, "selection_time")

    def timed_communication(self):
        return _Stopwatch(self, "communication_time")

    def exchange_header(self, count, *extras):
        """Allgather ``[fingerprint, non-finite, count, *extras]``; check it on every rank.

        Returns an int64 array of shape ``(P, 1 + len(extras))``: every rank's
        count and extras.
        """
        fingerprint = self.layout.fingerprint
        header = np.array([fingerprint, 0 if self.finite else 1, count, *extras], dtype=np.int64)
        with self.timed_communication():
            table = self.comm.allgather_host(header)
        differing = np.flatnonzero(table[:, 0] != fingerprint)
        if differing.size:
            raise ModelMismatchError(
                f"rank {self.rank}'s model ({self.layout.describe()}) differs from rank(s) "
                f"{differing.tolist()}: every rank must pass the same parameters, in the same "
                "order, with the same shapes and dtypes")
        bad = np.flatnonzero(table[:, 1])
        if bad.size:
            raise NonFiniteGradientError(bad.tolist(), self.step)
        return table[:, 2:]


class _Stopwatch:
    def __init__(self, context, attribute):
        self.context, self.attribute = context, attribute

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        elapsed = time.perf_counter() - self.start
        setattr(self.context, self.attribute, getattr(self.context, self.attribute) + elapsed)


class GradientExchange:
    """Sparse, error-feedback gradient averaging of one model across ranks.

    Parameters
    ----------
    sparsifier : a ``core.methods`` object (``create(name, **kw)`` builds one).
    ops : ``ArrayOps`` of the gradients' framework.
    comm : ``Communicator`` of the ranks.
    nonfinite : ``"raise"`` (default) raises :class:`NonFiniteGradientError`
        on every rank; ``"skip"`` returns a zero gradient on every rank.  Either
        way the residuals stay exactly as before the step.
    history_size : how many steps of ``StepMetrics`` ``history`` keeps (the
        newest; 1,000 by default), so a long run's memory does not grow.
    """

    def __init__(self, sparsifier, ops, comm, nonfinite="raise", history_size=1000):
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        self.sparsifier, self.ops, self.comm = sparsifier, ops, comm
        self.nonfinite = nonfinite
        self.feedback = ErrorFeedback(ops, momentum=sparsifier.momentum)
        self.step_count = 0
        self.history = collections.deque(maxlen=history_size)
        # Two output buffers, alternating: the aggregate a step returns stays
        # valid through the next step (Horovod makes p.grad a view of it).
        self._aggregates, self._output_size = [None, None], None

    @property
    def metrics(self):
        """Metrics of the last step (``None`` before the first)."""
        return self.history[-1] if self.history else None

    def step(self, grads, layout):
        """Average the flat gradients ``grads`` (one per layout entry) sparsely.

        Returns the flat averaged aggregate (``layout.n`` elements).  It lives
        in one of two output buffers used in turn: valid until the step after
        next overwrites it (copy it to keep it longer).
        """
        self.comm.reset_traffic()
        acc = self.feedback.accumulate(grads, layout, self._clip_scale(grads))
        context = StepContext(self.ops, self.comm, layout, self.step_count,
                              finite=self.ops.all_finite(acc), aggregate=self._output(layout, acc),
                              feedback=self.feedback)
        try:
            aggregate, metrics = self.sparsifier.exchange(acc, context)
        except NonFiniteGradientError:
            if self.nonfinite == "raise":
                raise
            aggregate = context.new_aggregate()
            metrics = StepMetrics(step=self.step_count, n=layout.n, k=self.sparsifier.k(layout.n),
                                  counts=[0] * self.comm.size, nnz=0, skipped=True)
        else:
            self.feedback.commit()
        traffic = self.comm.traffic.totals()
        metrics.elements_sent = traffic["elements_sent"]
        metrics.elements_received = traffic["elements_received"]
        metrics.bytes_sent = traffic["bytes_sent"]
        metrics.bytes_received = traffic["bytes_received"]
        metrics.selection_time = context.selection_time
        metrics.communication_time = context.communication_time
        self.history.append(metrics)
        self.step_count += 1
        return aggregate

    def _clip_scale(self, grads):
        """DGC's local gradient clipping: scale so ``||g|| <= clip_norm / sqrt(P)``
        (``None`` when the sparsifier does not clip or the norm is already below)."""
        clip_norm = self.sparsifier.clip_norm
        if clip_norm is None:
            return None
        norm = math.sqrt(math.fsum(float(self.ops.segment_sq_norms(g, [(0, len(g))])[0])
                                   for g in grads))
        coefficient = clip_norm / math.sqrt(self.comm.size) / (norm + 1e-6)
        return coefficient if coefficient < 1 else None

    def _output(self, layout, like):
        if self._output_size != layout.n:
            self._aggregates, self._output_size = [None, None], layout.n
        slot = self.step_count % 2
        if self._aggregates[slot] is None:
            self._aggregates[slot] = self.ops.zeros(layout.n, like)
        return self._aggregates[slot]

    def state_dict(self, layout):
        return {"step": self.step_count, **self.feedback.state_dict(layout),
                "sparsifier": self.sparsifier.state_dict()}

    def load_state_dict(self, state):
        self.step_count = int(state["step"])
        self.feedback.load_state_dict(state)
        if "sparsifier" in state:  # absent when carried over to another rank count
            self.sparsifier.load_state_dict(state["sparsifier"])
