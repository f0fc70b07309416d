"""Small gradients sent densely: which ones skip sparsification, and their state.

DGC (Lin et al., ICLR 2018) and PowerSGD (Vogels et al., NeurIPS 2019) leave
small tensors -- biases, normalization scales -- uncompressed: they are a
sliver of the traffic, and sparsifying them delays the coordinates that move
the model most per element.  With ``dense_below=N`` (and optionally
``dense_1d=True``) the gradients with fewer than ``N`` elements (or one
dimension) are averaged exactly, by one allreduce in the same step, after the
step's header; the rest of the model is sparsified as usual and its density
is counted over the sparsified part alone.

No residual is kept for the dense part (nothing is left behind).  Under
momentum correction (DGC, gs-SGD: the optimizer runs without momentum) the
dense part keeps a plain velocity ``u = m u + g`` and sends ``u`` (Nesterov:
``m u + g``): momentum SGD on those tensors (no dampening or weight decay).  Values travel
in the step's wire dtype, as Horovod's dense allreduce would send them (float16
for an all-float16 model: there the dense part's rounding is not kept).

The output of a step is one flat vector ordered ``[sparsified part | dense
part]`` (each in layout order): the sparsifier scatters into its prefix,
the dense average fills the suffix, and :attr:`Split.output_bounds` tells
the adapters where each gradient lies.
"""

from dataclasses import dataclass
from functools import cached_property

from .feedback import Buffer, refuse_unknown
from .layout import Layout


def dense_positions(layout, dense_below=None, dense_1d=False):
    """Positions in ``layout`` of the gradients sent densely: fewer than
    ``dense_below`` elements, or (``dense_1d``) of one dimension."""
    return tuple(i for i, (size, shape) in enumerate(zip(layout.sizes, layout.shapes))
                 if (dense_below is not None and size < dense_below)
                 or (dense_1d and len(shape) <= 1))


@dataclass(frozen=True)
class Split:
    """A model's ``layout`` split into the sparsified gradients and the ``dense`` ones."""

    layout: Layout
    dense: tuple

    @cached_property
    def sparse(self):
        dense = set(self.dense)
        return tuple(i for i in range(len(self.layout.names)) if i not in dense)

    @cached_property
    def sparse_layout(self):
        return self.layout.subset(self.sparse)

    @cached_property
    def dense_layout(self):
        return self.layout.subset(self.dense)

    @cached_property
    def output_bounds(self):
        """``(start, stop)`` of every gradient of ``layout`` in the step's output."""
        bounds = [None] * len(self.layout.names)
        n_sparse = self.sparse_layout.n
        for part, offset in ((self.sparse, 0), (self.dense, n_sparse)):
            for position, (start, stop) in zip(part, self.layout.subset(part).bounds):
                bounds[position] = (offset + start, offset + stop)
        return tuple(bounds)

    def held_in(self, part, held):
        """``held`` positions of ``layout`` as positions within ``part``."""
        index = {position: j for j, position in enumerate(part)}
        return tuple(index[i] for i in held if i in index)


class DensePart:
    """The dense gradients of a step as one flat vector (with momentum: the velocity)."""

    def __init__(self, ops, momentum=0.0, nesterov=False):
        self.ops, self.momentum, self.nesterov = ops, float(momentum), bool(nesterov)
        self._velocity = Buffer("sent densely")
        self._out, self._out_size = None, None
        self._held_bounds = ()  # a whole step's held gradients (gather() copies them itself)

    def gather(self, grads, layout, like, held=(), scale=None):
        """``scale * g`` (or the new velocity ``u = m u + scale * g``; Nesterov
        ``m u + scale * g`` with the new ``u``) of every gradient
        in ``layout`` as one flat vector on ``like``'s device, zeros for ``held``
        ones; the velocity of a held gradient is kept.  Returns ``(vector, all finite)``."""
        ops = self.ops
        if self._out_size != layout.n:
            self._out, self._out_size = ops.zeros(layout.n, like), layout.n
        out = self._out
        ops.fill_zero(out)
        self._held_bounds = ()  # (held here: copied below, not at the commit)
        if self.momentum:
            self._velocity.ensure(ops, layout, like)
            new, old = self._velocity.spare, self._velocity.current
        for i, (grad, (start, stop)) in enumerate(zip(grads, layout.bounds)):
            if i in held:
                if self.momentum:
                    ops.add_slice(new, old, 0.0, start, stop)
                continue
            grad = grad if scale is None else ops.multiply(grad, scale)
            self.whole_slice(out, grad, start, stop)
        return out, ops.all_finite(out)

    @property
    def velocity_buffer(self):
        """The velocity's :class:`~horovod_sparse.core.feedback.Buffer`."""
        return self._velocity

    def begin_whole(self, layout, held, like):
        """A step whose dense gradients are sent one by one (:meth:`whole_slice`)."""
        self._held_bounds = tuple(layout.bounds[i] for i in held)
        if self.momentum and layout.n:
            self._velocity.ensure(self.ops, layout, like)

    def whole_slice(self, out, grad, start, stop):
        """``out[start:stop] = g`` (with momentum ``u = m u + g`` first, and ``u`` or,
        Nesterov, ``m u + g`` sent); ``grad`` may be a view of that slice of ``out``."""
        if self.momentum:
            new, old = self._velocity.spare, self._velocity.current
            self.ops.scale_add_slice(new, old, self.momentum, grad, start, stop)
            if self.nesterov:  # out is written before grad is read: a copy (a small gradient)
                grad = self.ops.multiply(grad, 1.0)
                self.ops.scale_add_slice(out, new, self.momentum, grad, start, stop)
                return
            grad = new[start:stop]
        self.ops.copy_slice(out, grad, start, stop)

    def refuse_pending(self, layout):
        """A model without a dense part must not silently drop loaded dense velocities."""
        refuse_unknown(self._velocity.pending, layout, "sent densely")

    def commit(self):
        """The step went through: the new velocity becomes the current one (a held
        gradient's of a whole step kept)."""
        if self.momentum and self._velocity.spare is not None:
            for start, stop in self._held_bounds:
                self.ops.add_slice(self._velocity.spare, self._velocity.current, 0.0, start, stop)
            self._velocity.swap()
        self._held_bounds = ()

    def state_dict(self, layout):
        return {"dense_velocities": self._velocity.state_dict(self.ops, layout)} \
            if self.momentum else {}

    def load_state_dict(self, state):
        self._velocity.load(state.get("dense_velocities", {}))
