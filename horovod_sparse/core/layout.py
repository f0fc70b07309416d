"""The flattened-model layout: which gradient occupies which slice of one vector."""

import hashlib
import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Layout:
    """Names and shapes of the model's gradients, in the order they are flattened.

    ``offsets[i]:offsets[i] + sizes[i]`` is gradient ``i``'s slice of the flat
    vector of ``n`` elements.  ``fingerprint`` is a 63-bit digest of names,
    shapes and dtypes; ranks compare it every step, so models that differ
    across ranks fail loudly instead of exchanging misaligned coordinates.
    """

    names: tuple
    shapes: tuple
    dtypes: tuple

    @cached_property
    def sizes(self):
        return tuple(math.prod(shape) for shape in self.shapes)

    @cached_property
    def offsets(self):
        offsets, total = [], 0
        for size in self.sizes:
            offsets.append(total)
            total += size
        return tuple(offsets)

    @cached_property
    def n(self):
        return sum(self.sizes)

    @cached_property
    def bounds(self):
        """``(start, stop)`` of every gradient in the flat vector."""
        return tuple((o, o + s) for o, s in zip(self.offsets, self.sizes))

    @cached_property
    def fingerprint(self):
        text = repr((self.names, self.shapes, self.dtypes)).encode()
        return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1

    def subset(self, positions):
        """The layout of the entries at ``positions``, in that order."""
        return Layout(names=tuple(self.names[i] for i in positions),
                      shapes=tuple(self.shapes[i] for i in positions),
                      dtypes=tuple(self.dtypes[i] for i in positions))

    def describe(self):
        return ", ".join(f"{name}{list(shape)}:{dtype}"
                         for name, shape, dtype in zip(self.names, self.shapes, self.dtypes))
