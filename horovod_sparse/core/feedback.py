"""Error feedback: the residual memory every sparsifier keeps.

``acc_t = g_t + e_t`` is formed in a spare buffer; the sparsifier zeroes the
coordinates it has communicated (:meth:`ErrorFeedback.clear`), and only then
does ``acc_t`` become the new residual ``e_{t+1}`` (:meth:`commit`).  Until
the commit the old residual is untouched, so a step abandoned for a bad
gradient loses nothing.  Which coordinates are zeroed is the sparsifier's
rule (own selection for Top-k, every gathered index for the partition
family, ...).

With ``momentum = m > 0`` the memory is DGC's *momentum correction*
(Lin et al., ICLR 2018; also Sketched-SGD's worker state): a velocity
``u_t = m u_{t-1} + g_t`` is kept too, ``acc_t = e_t + u_t``, and both are
zeroed at the communicated coordinates ("factor masking").  With
``nesterov=True``, ``acc_t = e_t + m u_t + g_t``: the released DGC code's
``mmt = m (mmt + g)``, ``v = v + mmt + g`` with ``mmt = m u``.

A *held* gradient (absent this step: a frozen parameter, a variable without a
gradient) contributes zeros to ``acc``, so none of it is selected, and its
residual and velocity are carried to the next step unchanged.
"""

import numpy as np


class Buffer:
    """One flat state vector (current and spare), loadable by gradient name;
    ``part`` names the gradients it covers, for the error on a saved name it lacks."""

    def __init__(self, part="sparsified"):
        self.current = self.spare = None
        self.pending = {}
        self.part = part

    def load(self, state):
        self.pending = {name: np.asarray(value, dtype=np.float32).reshape(-1)
                        for name, value in state.items()}
        self.current = self.spare = None

    def ensure(self, ops, layout, like):
        if self.current is None:
            self.current = ops.from_host(_restore(self.pending, layout, self.part), like)
            self.pending = {}
        if self.spare is None:
            self.spare = ops.zeros(layout.n, self.current)

    def swap(self):
        self.spare, self.current = self.current, self.spare

    def momentum_step(self, ops, momentum, result, start, stop):
        """Momentum SGD on an averaged gradient ``result`` (a velocity): ``u = m u +
        result`` over ``[start, stop)`` into the spare (committed by a swap), and
        ``result = u`` in place."""
        ops.scale_add_slice(self.spare, self.current, momentum, result, start, stop)
        ops.add_slice(result, self.spare[start:stop], 0.0, 0, stop - start)

    def adopt(self, ops, values, start, stop):
        """``current[start:stop] = values[start:stop]``."""
        ops.add_slice(self.current, values, 0.0, start, stop)

    def state_dict(self, ops, layout):
        if self.current is None or layout is None:
            return dict(self.pending)
        host = ops.to_host(self.current)
        return {name: np.array(host[start:stop])
                for name, (start, stop) in zip(layout.names, layout.bounds)}


def refuse_unknown(names, layout, part):
    """``KeyError`` for saved state of gradients that are not in ``layout``, the
    ``part`` of the model (``"sparsified"`` or ``"sent densely"``) it belongs to."""
    unknown = set(names) - set(layout.names)
    if unknown:
        raise KeyError(f"saved state for gradients that are not {part} here (the model lacks "
                       f"them, or dense_below / dense_1d / dgc's variant differ from the run that "
                       f"saved it): "
                       f"{sorted(unknown)}")


def _restore(saved, layout, part):
    refuse_unknown(saved, layout, part)
    host = np.zeros(layout.n, dtype=np.float32)
    for name, (start, stop) in zip(layout.names, layout.bounds):
        if name in saved:
            value = saved[name]
            if value.size != stop - start:
                raise ValueError(f"saved state for {name!r} has {value.size} elements, "
                                 f"the model's gradient has {stop - start}")
            host[start:stop] = value
    return host


class ErrorFeedback:
    """Flat residual (and velocity) of the whole model, saved per gradient name."""

    def __init__(self, ops, momentum=0.0, nesterov=False):
        self.ops, self.momentum, self.nesterov = ops, float(momentum), bool(nesterov)
        self._residual, self._velocity = Buffer(), Buffer()
        self._held = ()  # (start, stop) of this step's held gradients
        self.finite = None  # whether the last acc is all finite (None: not checked)

    @property
    def residual(self):
        return self._residual.current

    @property
    def velocity(self):
        """``u`` of momentum correction (``None`` without momentum)."""
        return self._velocity.current if self.momentum else None

    @property
    def velocity_buffer(self):
        """The velocity's :class:`Buffer` (current and spare)."""
        return self._velocity

    def accumulate(self, grads, layout, scale=None, held=(), like=None, zero=None):
        """Return ``acc = residual + grads`` (``residual + u`` with momentum, ``residual
        + m u + grads`` with Nesterov), in spare buffers.

        ``scale`` (a number) multiplies every gradient first (local clipping);
        ``held`` lists the positions of absent gradients (zeros in ``acc``;
        their ``grads`` entries are not read and may be ``None``); new buffers go
        on ``like``'s device (default: the first gradient's); ``zero``
        (optional, at least ``layout.n`` long) is zeroed over ``[0, layout.n)``
        in the same pass.  One pass
        per gradient; :attr:`finite` tells whether every element of ``acc`` is
        finite where the backend checked in that pass (``None`` otherwise).
        """
        ops = self.ops
        if like is None:
            like = next(grad for i, grad in enumerate(grads) if i not in held)
        self._residual.ensure(ops, layout, like)
        if self.momentum:
            self._velocity.ensure(ops, layout, like)
        acc = self._residual.spare
        velocity = (self._velocity.spare, self._velocity.current) if self.momentum else None
        self._held = tuple(layout.bounds[i] for i in held)
        self.finite = True
        for i, (grad, (start, stop)) in enumerate(zip(grads, layout.bounds)):
            if i in held:
                ops.fill_zero(acc[start:stop])
                if zero is not None:
                    ops.fill_zero(zero[start:stop])
                continue
            finite = ops.accumulate_slice(acc, self.residual, grad, start, stop, scale, velocity,
                                          self.momentum, self.nesterov, zero)
            self.finite = None if finite is None or self.finite is None else self.finite and finite
        return acc

    def clear(self, indices, wire_dtype="float32"):
        """Zero the communicated ``indices`` in the accumulated gradient (and velocity).

        Values sent in a narrower ``wire_dtype`` (float16) leave their rounding
        error in the residual instead of zero: nothing is lost on the wire.
        """
        if wire_dtype == "float32":
            self.ops.zero_at(self._residual.spare, indices)
        else:
            self.ops.keep_rounding_error(self._residual.spare, indices, wire_dtype)
        if self.momentum:
            self.ops.zero_at(self._velocity.spare, indices)

    def begin_whole(self, layout, held, like):
        """A step that sends every gradient whole (:meth:`whole_slice`, one by one)."""
        self._residual.ensure(self.ops, layout, like)
        if self.momentum:
            self._velocity.ensure(self.ops, layout, like)
        self._held = tuple(layout.bounds[i] for i in held)

    def whole_slice(self, out, grad, start, stop):
        """``out[start:stop] = e + g`` (``e + u``, ``u = m u + g``, under momentum
        correction; Nesterov: ``e + m u + g``) for the gradient at ``[start, stop)``:
        what it sends whole (``out`` is zero there)."""
        self.ops.accumulate_slice(out, self.residual, grad, start, stop, None,
                                  (self._velocity.spare, self._velocity.current)
                                  if self.momentum else None, self.momentum, self.nesterov)

    def flush(self, wire_dtype="float32"):
        """Every coordinate was sent: zero the accumulated gradient (float16: keep
        the rounding error); the velocity is kept, as momentum SGD keeps it."""
        spare = self._residual.spare
        if wire_dtype == "float32":
            self.ops.fill_zero(spare)
        else:
            self.ops.keep_rounding_error(spare, self.ops.arange(0, spare.shape[0], spare),
                                         wire_dtype)

    def commit(self, residual=True):
        """Make the accumulated buffers (after :meth:`clear`) the new residual and
        velocity (``residual=False``: the velocity only); held gradients keep their
        old ones."""
        buffers = [self._residual] if residual else []
        if self.momentum:
            buffers.append(self._velocity)
        for buffer in buffers:
            for start, stop in self._held:  # spare[start:stop] = current[start:stop]
                self.ops.add_slice(buffer.spare, buffer.current, 0.0, start, stop)
            buffer.swap()

    def state_dict(self, layout):
        state = {"residuals": self._residual.state_dict(self.ops, layout)}
        if self.momentum:
            state["velocities"] = self._velocity.state_dict(self.ops, layout)
        return state

    def load_state_dict(self, state):
        """Restore by gradient name; the vectors are placed at the next step."""
        self._residual.load(state["residuals"])
        self._velocity.load(state.get("velocities", {}))
