"""Error feedback: the residual memory every sparsifier keeps.

``acc_t = g_t + e_t`` is formed in a spare buffer; the sparsifier zeroes the
coordinates it has communicated (:meth:`ErrorFeedback.clear`), and only then
does ``acc_t`` become the new residual ``e_{t+1}`` (:meth:`commit`).  Until
the step's header has passed the old residual is untouched, so a step refused
for a bad gradient or a mismatch loses nothing.  Which coordinates are zeroed
is the sparsifier's rule (own selection for Top-k, every gathered index for
the partition family, ...).

The two buffers hold the step's output too, so the exchange keeps two
gradient sizes in all (the whole model's: the dense part's output after the
sparsified part's).  Once the header has passed, the old residual is needed
no more -- ``acc`` holds all it held -- and its buffer takes the step's output
(:meth:`ErrorFeedback.output`), which stays ``p.grad``'s storage until the
next step forms its ``acc`` there; under PyTorch's
``zero_grad(set_to_none=False)`` the next gradients *are* that buffer, each
element read before ``acc`` overwrites it.  The price: a collective that
fails after the header loses that step's residual (elastic training restores
the last committed one).

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

    def ensure(self, ops, layout, like, size=None):
        """Place the buffers (``size`` elements, at least ``layout.n``: ``layout``'s
        gradients first) on ``like``'s device, the loaded state in ``current``."""
        if self.current is None:
            host = _restore(self.pending, layout, self.part, layout.n if size is None else size)
            self.current = ops.from_host(host, like)
            self.pending = {}
        if self.spare is None:
            self.spare = ops.zeros(self.current.shape[0], self.current)

    def swap(self):
        self.spare, self.current = self.current, self.spare

    def momentum_step(self, ops, momentum, result, start, stop):
        """Momentum SGD on an averaged gradient ``result`` (a velocity): ``u = m u +
        result`` over ``[start, stop)`` into the spare (committed by a swap), and
        ``result = u`` in place; return whether ``result`` is finite."""
        return ops.momentum_slice(self.spare, self.current, momentum, result, start, stop)

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


def _restore(saved, layout, part, size):
    refuse_unknown(saved, layout, part)
    host = np.zeros(size, dtype=np.float32)
    for name, (start, stop) in zip(layout.names, layout.bounds):
        if name in saved:
            value = saved[name]
            if value.size != stop - start:
                raise ValueError(f"saved state for {name!r} has {value.size} elements, "
                                 f"the model's gradient has {stop - start}")
            host[start:stop] = value
    return host


class ErrorFeedback:
    """Flat residual (and velocity) of the whole model, saved per gradient name.

    A step: :meth:`begin`, :meth:`accumulate`, and past the header
    :meth:`output`, :meth:`clear` or :meth:`flush`, :meth:`commit`; a refused
    step takes :meth:`spare_output` instead and commits nothing.  A *whole*
    step (every gradient sent as it comes: ``core.fallback``) writes into
    :meth:`spare_output` with :meth:`whole_slice` and ends with
    :meth:`end_whole`.
    """

    def __init__(self, ops, momentum=0.0, nesterov=False):
        self.ops, self.momentum, self.nesterov = ops, float(momentum), bool(nesterov)
        self._residual, self._velocity = Buffer(), Buffer()
        self._layout, self._held_positions = None, ()
        self._held = ()        # (start, stop) of this step's held gradients
        self._set_aside = ()   # their residuals while the output holds the residual's buffer
        self.finite = None  # whether the last acc is all finite (None: not checked)
        self._scan = self._found = None  # accumulate's scan request and what it collected

    @property
    def residual(self):
        """``e``, over the sparsified gradients."""
        return self._sparsified(self._residual.current)

    @property
    def velocity(self):
        """``u`` of momentum correction (``None`` without momentum)."""
        return self._velocity.current if self.momentum else None

    @property
    def velocity_buffer(self):
        """The velocity's :class:`Buffer` (current and spare)."""
        return self._velocity

    def begin(self, layout, held, like, size):
        """Start a step over the sparsified gradients ``layout`` (``held``: positions
        of absent ones), its output ``size`` elements long (at least ``layout.n``);
        new buffers go on ``like``'s device."""
        self._residual.ensure(self.ops, layout, like, size)
        if self.momentum:
            self._velocity.ensure(self.ops, layout, like)
        self._layout, self._held_positions = layout, held
        self._held = tuple(layout.bounds[i] for i in held)
        self._set_aside = ()

    def accumulate(self, grads, scale=None, scan=None):
        """Return ``acc = residual + grads`` (``residual + u`` with momentum, ``residual
        + m u + grads`` with Nesterov) in the spare buffer, where the last step's
        output was (a gradient may be a view of it there).

        ``scale`` (a number) multiplies every gradient first (local clipping);
        held gradients (:meth:`begin`) are zeros in ``acc`` and their ``grads``
        entries are not read (``None`` will do).  One pass per gradient;
        :attr:`finite` tells whether every element of ``acc`` is finite where
        the backend checked in that pass (``None`` otherwise).

        ``scan = (start, stop, threshold, expected)`` (without momentum) also
        collects the ``(i, acc_i)`` with ``|acc_i| >= threshold``, ``i`` in
        ``[start, stop)`` (about ``expected``), in the same pass where the
        backend can: :meth:`scanned` returns them.
        """
        ops = self.ops
        acc = self._residual.spare
        velocity = (self._velocity.spare, self._velocity.current) if self.momentum else None
        self.finite = True
        self._scan, found = scan, []
        for i, (grad, (start, stop)) in enumerate(zip(grads, self._layout.bounds)):
            if i in self._held_positions:  # zeros: under any scan's threshold (> 0)
                ops.fill_zero(acc[start:stop])
                continue
            lo, hi = (start, start) if scan is None else (max(start, scan[0]), min(stop, scan[1]))
            if lo < hi:
                share = scan[3] * (hi - lo) // (scan[1] - scan[0])
                finite, indices, values = ops.accumulate_scan_slice(
                    acc, self._residual.current, grad, start, stop, scale,
                    (lo, hi, scan[2], share))
                found.append((indices, values))
            else:
                finite = ops.accumulate_slice(acc, self._residual.current, grad, start, stop,
                                              scale, velocity, self.momentum, self.nesterov)
            self.finite = None if finite is None or self.finite is None else self.finite and finite
        if len(found) > 1:  # a share over several gradients
            found = [tuple(ops.concat(list(part)) for part in zip(*found))]
        self._found = found[0] if found else None
        return self._sparsified(acc)

    def scanned(self, start, stop, threshold):
        """``(indices, values)`` collected by this step's :meth:`accumulate` for
        exactly this range and threshold, or ``None`` (not asked for, or the range
        lies in held gradients).  Handed over: the feedback keeps no reference,
        so they live no longer than the step that uses them."""
        if self._scan is None or tuple(self._scan[:3]) != (start, stop, threshold):
            return None
        found, self._scan, self._found = self._found, None, None
        return found

    def output(self):
        """The step's output buffer, zeroed, for a step past its header: the old
        residual's (``acc`` holds all it held); held gradients' residuals are set
        aside until :meth:`commit`."""
        self._set_aside = self._empty_current()
        return self._residual.current

    def spare_output(self):
        """The output buffer of a step that keeps its residual to the end (refused,
        or whole): ``acc``'s, unzeroed."""
        return self._residual.spare

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

    def whole_slice(self, out, grad, start, stop):
        """``out[start:stop] = e + g`` (``e + u``, ``u = m u + g``, under momentum
        correction; Nesterov: ``e + m u + g``) for the gradient at ``[start, stop)``:
        what it sends whole (``grad`` may be a view of that slice of ``out``)."""
        self.ops.accumulate_slice(out, self._residual.current, grad, start, stop, None,
                                  (self._velocity.spare, self._velocity.current)
                                  if self.momentum else None, self.momentum, self.nesterov)

    def flush(self, wire_dtype="float32"):
        """Every coordinate was sent: zero the accumulated gradient (float16: keep
        the rounding error); the velocity is kept, as momentum SGD keeps it."""
        spare, n = self._residual.spare, self._layout.n
        if wire_dtype == "float32":
            self.ops.fill_zero(spare[:n])
        else:
            self.ops.keep_rounding_error(spare, self.ops.arange(0, n, spare), wire_dtype)

    def commit(self):
        """Make the accumulated buffers (after :meth:`clear`) the new residual and
        velocity; held gradients keep their old ones."""
        spare = self._residual.spare
        for (start, stop), values in zip(self._held, self._set_aside):
            self.ops.copy_slice(spare, values, start, stop)
        self._residual.swap()
        self._set_aside = ()
        self.commit_velocity()

    def end_whole(self):
        """A whole step went through: the residual is empty (but a held gradient's),
        the new velocity kept; the output stays in :meth:`spare_output`."""
        for (start, stop), values in zip(self._held, self._empty_current()):
            self.ops.copy_slice(self._residual.current, values, start, stop)
        self.commit_velocity()

    def commit_velocity(self):
        """Make the new velocity the current one (a held gradient's kept)."""
        if self.momentum:
            buffer = self._velocity
            for start, stop in self._held:
                self.ops.copy_slice(buffer.spare, buffer.current[start:stop], start, stop)
            buffer.swap()

    def _sparsified(self, buffer):
        """``buffer`` over the sparsified gradients (the output's dense part cut off;
        TensorFlow: a copy, so read before any :meth:`clear`)."""
        n = self._layout.n if self._layout is not None else None
        return buffer if buffer is None or n is None or buffer.shape[0] == n else buffer[:n]

    def _empty_current(self):
        """Zero the residual's buffer; return copies of its held gradients' slices."""
        current, ops = self._residual.current, self.ops
        held = [ops.multiply(current[start:stop], 1.0) for start, stop in self._held]  # copies
        ops.fill_zero(current)
        return held

    def state_dict(self, layout):
        state = {"residuals": self._residual.state_dict(self.ops, layout)}
        if self.momentum:
            state["velocities"] = self._velocity.state_dict(self.ops, layout)
        return state

    def load_state_dict(self, state):
        """Restore by gradient name; the vectors are placed at the next step."""
        self._residual.load(state["residuals"])
        self._velocity.load(state.get("velocities", {}))
