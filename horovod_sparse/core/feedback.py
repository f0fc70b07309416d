"""Error feedback: the residual memory every sparsifier keeps.

``acc_t = g_t + e_t`` is formed in a spare buffer; the sparsifier zeroes the
coordinates it has communicated, and only then does ``acc_t`` become the new
residual ``e_{t+1}`` (:meth:`commit`).  Until the commit the old residual is
untouched, so a step abandoned for a bad gradient loses nothing.  Which
coordinates are zeroed is the sparsifier's rule (own selection for Top-k,
every gathered index for the partition family, ...).
"""

import numpy as np


class ErrorFeedback:
    """Flat residual of the whole model, exposed per gradient name in ``state_dict``."""

    def __init__(self, ops):
        self.ops = ops
        self.residual = None
        self._spare = None
        self._pending = {}

    def accumulate(self, grads, layout):
        """Return ``acc = grads + residual`` (flat), written into the spare buffer."""
        like = grads[0]
        if self.residual is None:
            self.residual = self.ops.from_host(self._initial_residual(layout), like)
            self._pending = {}
        if self._spare is None:
            self._spare = self.ops.zeros(layout.n, self.residual)
        acc = self._spare
        for grad, (start, stop) in zip(grads, layout.bounds):
            self.ops.add_slice(acc, self.residual, grad, start, stop)
        return acc

    def commit(self, acc):
        """Make ``acc`` (after the sparsifier zeroed what it sent) the residual."""
        self._spare, self.residual = self.residual, acc

    def state_dict(self, layout):
        if self.residual is None or layout is None:
            return dict(self._pending)
        host = self.ops.to_host(self.residual)
        return {name: np.array(host[start:stop]) for name, (start, stop)
                in zip(layout.names, layout.bounds)}

    def load_state_dict(self, state):
        """Restore residuals by gradient name; they are placed at the next step."""
        self._pending = {name: np.asarray(value, dtype=np.float32).reshape(-1)
                         for name, value in state.items()}
        self.residual = self._spare = None

    def _initial_residual(self, layout):
        unknown = set(self._pending) - set(layout.names)
        if unknown:
            raise KeyError(f"saved residuals for gradients this model lacks: {sorted(unknown)}")
        host = np.zeros(layout.n, dtype=np.float32)
        for name, (start, stop) in zip(layout.names, layout.bounds):
            if name in self._pending:
                value = self._pending[name]
                if value.size != stop - start:
                    raise ValueError(f"saved residual for {name!r} has {value.size} elements, "
                                     f"the model's gradient has {stop - start}")
                host[start:stop] = value
        return host
