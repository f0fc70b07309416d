"""Single-pass CPU kernels over numpy vectors, compiled with numba.

The sparse step is memory-bound: its floor is one pass over the gradient to
form ``acc = g + e`` and one read of the part a rank selects from.  These
kernels keep each phase at one pass:

* :func:`accumulate` forms ``acc = residual + scale * grad`` (or, under
  momentum correction, ``u = m u + scale * grad``, ``acc = residual + u``;
  Nesterov: ``acc = residual + m u + scale * grad``)
  and checks that every result is finite in the same loop, on the value in
  its register (at the speed of numpy's ``add`` alone);
  :func:`accumulate_scan` also collects :func:`abs_ge_entries` over a range
  of the new ``acc``, each chunk while it is still in cache.  A slice of at
  least ``STREAM_MIN_BYTES`` is formed a cache line at a time as one vector
  and written with streaming stores, which skip reading the line they
  overwrite: three streams instead of four (momentum correction: five
  instead of seven), and the hits are taken from the vector (a copy of the
  line, in the cache), not read back from memory (measured on 16.8M
  float32s: 4 ms against 7 ms for the same loop through the cache);
* :func:`momentum_result` applies momentum SGD to an averaged gradient
  (``u = m u + r``, ``r = u``) and checks finiteness in the same loop;
* :func:`fill_zero` zeroes a large buffer with streaming stores, which skip
  reading the lines they overwrite;
* :func:`sq_norm` sums the squares in float64 in one read (numpy's and
  torch's float64 casts each allocate a float64 copy, twice the gradient);
* :func:`all_finite` checks a vector with one read of its exponent bits, on
  one thread: torch's and numpy's reductions wake a thread pool or allocate,
  which on a small model's step costs more than the read;
* :func:`abs_ge_entries` finds ``|x_i| >= t`` (indices and values) with one
  vectorized read: it writes a 64-bit hit mask per 64-element block, a chunk
  of blocks at a time, and walks the set bits of each mask (the chunk still
  in L2) by count-trailing-zeros, so a hit costs a few instructions, not a
  re-scan of its block; the caller's estimate of the hits sizes the output;
* :func:`count_abs_ge_each` counts ``|x_i| >= t_j`` for a whole ladder of
  thresholds in one read (each element starts at the first rung of its
  float's exponent-and-top-mantissa key and steps over the one or two rungs
  inside it without a branch), where sorting the magnitudes would cost
  ``m log m``;
* :func:`sketch_encode` and :func:`sketch_estimate` add a vector into a Count
  Sketch and read its estimates back (:mod:`horovod_sparse.core.sketch`),
  hashing each coordinate once per row in registers: no index or sign vector
  is materialized.

Without numba (it could not be imported), and for float16 which numba lacks,
the same functions run as chunked numpy code: same results (:func:`sq_norm`:
to float64 rounding), about twice the time (the sketch then takes
:class:`~horovod_sparse.core.sketch.CountSketch`'s generic path).
"""

import platform

import numpy as np

try:
    import numba
    from llvmlite import ir
    from numba.cpython.unsafe.numbers import trailing_zeros  # one tzcnt instruction
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - numba is a requirement; this keeps a broken install usable
    numba = None

BLOCK = 64        # elements per block of the scan: one bit each in a uint64 mask
BLOCKS_PER_CHUNK = 4096  # blocks whose masks are held at once (32 KiB; the chunk, 1 MiB, in L2)
SCAN_CHUNK_BLOCKS = 1024  # blocks accumulate_scan writes, then scans (256 KiB of acc)
SCAN_CHUNK = 1 << 16  # elements per step of the numpy scan
LANES = 8  # independent float64 sums in sq_norm (a power of two)
_COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # numba has no float16
_X86 = platform.machine().lower() in ("x86_64", "amd64")  # sfence orders streaming stores
KEY_SHIFT = 16  # float32 bits >> 16: the exponent and 7 mantissa bits (128 keys an octave)
HISTOGRAMS = 4  # interleaved copies of the ladder's histogram
LINE = 64  # bytes of a cache line: one streaming store
LINE_FLOATS = LINE // 4  # float32s in a line: one vector of the streaming accumulate
LINE_HITS = (1 << LINE_FLOATS) - 1  # the hit bits of _accumulate_line's masks
STREAM_MIN_BYTES = 1 << 22  # smaller buffers are written through the cache (they stay in it)
STREAM_CHUNK = 1 << 14  # elements the streaming accumulate writes before it appends their hits
MIN_CAPACITY = 1024  # entries abs_ge_entries makes room for at least
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)
INF_BITS = 0x7F800000  # float32 inf's bits; a NaN's magnitude bits are above
HASH_PRIME = 2 ** 31 - 1  # the sketch's Mersenne modulus: products of two residues fit in int64


def mersenne_mod(x):
    """``x mod (2**31 - 1)`` for ``0 <= x < 2**62`` by two folds and one subtraction
    (no division); works on Python ints, numpy int64 arrays and inside numba."""
    x = (x & HASH_PRIME) + (x >> 31)
    x = (x & HASH_PRIME) + (x >> 31)
    return x - HASH_PRIME * (x >= HASH_PRIME)


def sketch_hash(i, a, b, c3, c2, c1, c0, columns):
    """Bucket and sign bit of coordinate ``i`` in one Count Sketch row:
    ``h(i) = floor(((a i + b) mod p) C / 2**31)`` (pairwise independent, range
    reduced by a multiply and a shift instead of ``mod C``) and the low bit of
    ``((c3 i + c2) i + c1) i + c0 mod p`` (a degree-3 polynomial: 4-wise
    independent signs, as Sketched-SGD's ``CSVec``); ``p = 2**31 - 1``,
    ``i < p``, coefficients in ``[1, p)``."""
    bucket = (mersenne_mod(a * i + b) * columns) >> 31
    parity = mersenne_mod(mersenne_mod(mersenne_mod(c3 * i + c2) * i + c1) * i + c0) & 1
    return bucket, parity


if numba is not None:  # the same two functions, inlined into the kernels below
    mersenne_mod = numba.njit(inline="always")(mersenne_mod)
    sketch_hash = numba.njit(inline="always")(sketch_hash)


def sketch_positions(start, stop, coefficients, columns):
    """Numpy :func:`sketch_hash` of the coordinates ``[start, stop)`` for one row's
    six ``coefficients``: (int64 buckets, int64 sign bits; 1 means ``-1``)."""
    positions = np.arange(start, stop, dtype=np.int64)
    return sketch_hash(positions, *(np.int64(c) for c in coefficients), np.int64(columns))


def _numpy_abs_ge_entries(x, threshold, start, stop):
    threshold = x.dtype.type(threshold)
    found = []
    for first in range(start, stop, SCAN_CHUNK):
        chunk = x[first:min(first + SCAN_CHUNK, stop)]
        found.append(np.flatnonzero(np.abs(chunk) >= threshold) + first)
    indices = np.concatenate(found) if found else np.empty(0, dtype=np.int64)
    return indices, x[indices]


def _numpy_accumulate(acc, residual, grad, scale, velocity_new, velocity_old, momentum,
                      nesterov=False):
    if scale != 1:
        grad = grad * grad.dtype.type(scale)
    if velocity_new is not None:
        np.multiply(velocity_old, velocity_old.dtype.type(momentum), out=velocity_new)
        np.add(velocity_new, grad, out=velocity_new)
        if nesterov:  # m u + g rounded to acc's dtype first, as ArrayOps does
            np.add(velocity_new * velocity_new.dtype.type(momentum), grad, out=acc)  # grad may be acc
            grad = acc
        else:
            grad = velocity_new
    np.add(residual, grad, out=acc)
    return bool(np.isfinite(acc).all())


if numba is not None:
    _jit = numba.njit(nogil=True, cache=True)
    # fastmath only where it is exact: counting comparisons (a sum of 0/1) may be
    # reordered and vectorized; NaN compares false either way.
    _jit_counting = numba.njit(nogil=True, cache=True, fastmath=True)
    # The hit masks decide which elements are returned: every fast-math flag that
    # lets the loop vectorize, but not "no NaNs" / "no infs" (NaN compares false).
    _jit_masks = numba.njit(nogil=True, cache=True,
                            fastmath={"reassoc", "nsz", "arcp", "contract", "afn"})
    # Multiply-adds fused where the product is exact (a float32's square in float64), so
    # the one rounding is the add's, as unfused: the same sums at half the instructions.
    _jit_fused_multiply_add = numba.njit(nogil=True, cache=True, fastmath={"contract"})

    @_jit_masks
    def _block_masks(rows, first, last, threshold, masks):
        # rows[first:last] passed as bounds: a sliced 2-D argument does not vectorize
        for b in range(first, last):
            row = rows[b]
            mask = np.uint64(0)
            for j in range(BLOCK):
                mask |= np.uint64(abs(row[j]) >= threshold) << np.uint64(j)
            masks[b - first] = mask

    @_jit_counting
    def _set_bits(masks, count):
        total = 0
        for b in range(count):  # SWAR popcount
            m = masks[b]
            m = m - ((m >> np.uint64(1)) & np.uint64(0x5555555555555555))
            m = (m & np.uint64(0x3333333333333333)) + ((m >> np.uint64(2)) &
                                                       np.uint64(0x3333333333333333))
            m = (m + (m >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
            total += (m * np.uint64(0x0101010101010101)) >> np.uint64(56)
        return total

    @_jit
    def _write_hits(rows, first, last, masks, start, indices, values, count):
        for b in range(first, last):
            mask, base = masks[b - first], start + b * BLOCK
            while mask:  # the set bits, lowest first
                j = trailing_zeros(mask)
                indices[count] = base + j
                values[count] = rows[b, j]
                count += 1
                mask &= mask - np.uint64(1)
        return count

    @_jit
    def _grown(indices, values, count, need):
        size = max(2 * indices.size, need)
        grown_indices, grown_values = np.empty(size, np.int64), np.empty(size, values.dtype)
        grown_indices[:count], grown_values[:count] = indices[:count], values[:count]
        return grown_indices, grown_values

    @_jit
    def _append_abs_ge(x, threshold, start, stop, masks, indices, values, count):
        """Append the ``(i, x[i])`` with ``|x[i]| >= threshold``, ``i`` in ``[start,
        stop)``, at ``count`` (the buffers grown as needed); return them and the count."""
        blocks = (stop - start) // BLOCK
        rows = x[start:start + blocks * BLOCK].reshape((blocks, BLOCK))
        for first in range(0, blocks, BLOCKS_PER_CHUNK):
            last = min(first + BLOCKS_PER_CHUNK, blocks)
            _block_masks(rows, first, last, threshold, masks)
            need = count + _set_bits(masks, last - first)
            if need > indices.size:
                indices, values = _grown(indices, values, count, need)
            count = _write_hits(rows, first, last, masks, start, indices, values, count)
        tail_start = start + blocks * BLOCK
        if count + (stop - tail_start) > indices.size:
            indices, values = _grown(indices, values, count, count + stop - tail_start)
        for i in range(tail_start, stop):
            if abs(x[i]) >= threshold:
                indices[count], values[count] = i, x[i]
                count += 1
        return indices, values, count

    @_jit
    def _compiled_abs_ge_entries(x, threshold, start, stop, capacity):
        masks = np.empty(BLOCKS_PER_CHUNK, np.uint64)
        indices, values = np.empty(capacity, np.int64), np.empty(capacity, x.dtype)
        indices, values, count = _append_abs_ge(x, threshold, start, stop, masks, indices,
                                                values, 0)
        return indices[:count], values[:count]

    @_jit
    def _compiled_accumulate_scan(acc, residual, grad, scale, start, stop, lo, hi, threshold,
                                  capacity):
        # acc[start:stop] = residual[start:stop] + scale * grad, and the hits in [lo, hi)
        # collected a chunk at a time, right after the chunk is written (still in L2)
        finite = _compiled_accumulate(acc[start:lo], residual[start:lo], grad[:lo - start],
                                      scale)
        masks = np.empty(BLOCKS_PER_CHUNK, np.uint64)
        indices, values = np.empty(capacity, np.int64), np.empty(capacity, acc.dtype)
        count = 0
        for first in range(lo, hi, SCAN_CHUNK_BLOCKS * BLOCK):
            last = min(first + SCAN_CHUNK_BLOCKS * BLOCK, hi)
            chunk_finite = _compiled_accumulate(acc[first:last], residual[first:last],
                                                grad[first - start:last - start], scale)
            finite = finite and chunk_finite
            indices, values, count = _append_abs_ge(acc, threshold, first, last, masks, indices,
                                                    values, count)
        tail_finite = _compiled_accumulate(acc[hi:stop], residual[hi:stop], grad[hi - start:],
                                           scale)
        return finite and tail_finite, indices[:count], values[:count]

    @_jit_counting
    def _compiled_nonfinite32(bits):
        count = 0
        for i in range(bits.size):  # exponent all ones: inf or NaN
            count += (bits[i] & 0x7F800000) == 0x7F800000
        return count

    @_jit_counting
    def _compiled_nonfinite64(bits):
        count = 0
        for i in range(bits.size):
            count += (bits[i] & 0x7FF0000000000000) == 0x7FF0000000000000
        return count

    @intrinsic
    def _stream_zero_line(typingctx, data, offset):
        """Store a line of zero bytes at ``data[offset:offset + LINE]`` (aligned)
        with LLVM's ``!nontemporal`` hint: x86's ``movntdq``, which does not
        read the line into the cache before writing it."""
        def codegen(context, builder, signature, args):
            array = context.make_array(signature.args[0])(context, builder, args[0])
            line = ir.VectorType(ir.IntType(8), LINE)
            address = builder.bitcast(builder.gep(array.data, [args[1]]), line.as_pointer())
            store = builder.store(ir.Constant(line, [0] * LINE), address, align=LINE)
            store.set_metadata("nontemporal",
                               builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return numba.types.void(data, offset), codegen

    class _Lines:
        """LLVM IR for one line of float32s (``LINE_FLOATS``) as one vector, for the
        streaming intrinsics below."""

        vector = ir.VectorType(ir.FloatType(), LINE_FLOATS)
        lanes = ir.VectorType(ir.IntType(32), LINE_FLOATS)

        def __init__(self, context, builder, signature, args):
            self.context, self.builder, self.signature, self.args = (context, builder,
                                                                     signature, args)

        def _at(self, k, offset):
            array = self.context.make_array(self.signature.args[k])(self.context, self.builder,
                                                                    self.args[k])
            return self.builder.bitcast(self.builder.gep(array.data, [offset]),
                                        self.vector.as_pointer())

        def load(self, k, offset):
            """The line of array argument ``k`` at ``offset`` (any alignment)."""
            return self.builder.load(self._at(k, offset), align=4)

        def stream(self, value, k, offset):
            """Store ``value`` at ``offset`` (aligned to a line) of array argument ``k``
            with LLVM's ``!nontemporal`` hint: straight to memory (x86's
            ``vmovntps``), where a plain store first reads the line it overwrites."""
            store = self.builder.store(value, self._at(k, offset), align=LINE)
            store.set_metadata("nontemporal", self.builder.module.add_metadata(
                [ir.Constant(ir.IntType(32), 1)]))

        def copy(self, value, k):
            """Store ``value`` at the start of array argument ``k`` (through the cache)."""
            self.builder.store(value, self._at(k, ir.Constant(ir.IntType(64), 0)), align=4)

        def splat(self, scalar):
            one = self.builder.insert_element(ir.Constant(self.vector, ir.Undefined), scalar,
                                              ir.Constant(ir.IntType(32), 0))
            return self.builder.shuffle_vector(one, ir.Constant(self.vector, ir.Undefined),
                                               ir.Constant(self.lanes, [0] * LINE_FLOATS))

        def multiply_add(self, x, factor, y):
            """``x * factor + y``, lane by lane, the product and the sum each rounded."""
            return self.builder.fadd(self.builder.fmul(x, factor), y)

        def magnitude(self, value):
            bits = self.builder.bitcast(value, self.lanes)
            return self.builder.bitcast(self.builder.and_(
                bits, ir.Constant(self.lanes, [0x7FFFFFFF] * LINE_FLOATS)), self.vector)

        def mask(self, compared):
            """A lane comparison as an int64 bit mask (lane ``j``: bit ``j``)."""
            word = self.builder.bitcast(compared, ir.IntType(LINE_FLOATS))
            return self.builder.zext(word, ir.IntType(64))

        def nonfinite(self, value):
            """Bit mask of the lanes of ``value`` that are inf or NaN."""
            return self.mask(self.builder.fcmp_unordered(
                ">", self.magnitude(value),
                self.splat(ir.Constant(ir.FloatType(), float(FLOAT32_MAX)))))

    @intrinsic
    def _accumulate_line(typingctx, acc, residual, grad, line, offset, grad_offset, scale,
                         threshold):
        """``acc = residual + grad * scale`` for one line at ``acc[offset:]``
        (aligned) from ``residual[offset:]`` and ``grad[grad_offset:]``, as one
        vector, streamed to ``acc`` and copied into ``line`` (a small array that
        stays in the cache).  Returns the bit masks ``hits | nonfinite <<
        LINE_FLOATS``: lane ``j`` is a hit if ``|value| >= threshold`` (NaN never
        is), nonfinite if it is inf or NaN."""
        def codegen(context, builder, signature, args):
            lines = _Lines(context, builder, signature, args)
            value = lines.multiply_add(lines.load(2, args[5]), lines.splat(args[6]),
                                       lines.load(1, args[4]))
            lines.stream(value, 0, args[4])
            lines.copy(value, 3)
            hits = lines.mask(builder.fcmp_ordered(">=", lines.magnitude(value),
                                                   lines.splat(args[7])))
            return builder.or_(hits, builder.shl(lines.nonfinite(value),
                                                 ir.Constant(ir.IntType(64), LINE_FLOATS)))
        return numba.types.int64(acc, residual, grad, line, offset, grad_offset, scale,
                                 threshold), codegen

    @intrinsic
    def _accumulate_momentum_line(typingctx, acc, residual, grad, velocity_new, velocity_old,
                                  offset, grad_offset, scale, momentum, nesterov):
        """Momentum correction for one line, as :func:`_compiled_accumulate_momentum`
        computes each element: ``u = m u_old + s g`` streamed to ``velocity_new``
        and ``acc = residual + u`` (Nesterov: ``residual + (m u + s g)``) streamed
        to ``acc``, both at ``offset`` (aligned; ``grad`` at ``grad_offset``).
        Returns the bit mask of the nonfinite lanes of ``acc``."""
        def codegen(context, builder, signature, args):
            lines = _Lines(context, builder, signature, args)
            factor = lines.splat(args[8])
            scaled = builder.fmul(lines.load(2, args[6]), lines.splat(args[7]))
            velocity = lines.multiply_add(lines.load(4, args[5]), factor, scaled)
            lines.stream(velocity, 3, args[5])
            sent = builder.select(args[9], lines.multiply_add(velocity, factor, scaled),
                                  velocity)
            value = builder.fadd(lines.load(1, args[5]), sent)
            lines.stream(value, 0, args[5])
            return lines.nonfinite(value)
        return numba.types.int64(acc, residual, grad, velocity_new, velocity_old, offset,
                                 grad_offset, scale, momentum, nesterov), codegen

    @intrinsic
    def _store_fence(typingctx):
        """Order the streaming stores before every later store, so that another
        thread handed the buffer reads what they wrote: x86's ``sfence`` (the
        fence made for them), elsewhere a full fence."""
        def codegen(context, builder, signature, args):
            if _X86:
                builder.call(builder.module.declare_intrinsic(
                    "llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), [])), [])
            else:
                builder.fence("seq_cst")
        return numba.types.void(), codegen

    @_jit
    def _line_bounds(data, first, last):
        """``(lines_start, lines_stop)``: the whole lines (aligned, ``LINE`` bytes)
        of the float32 elements ``[first, last)`` of the vector at address ``data``."""
        lines_start = min(first + (-(data + 4 * first)) % LINE // 4, last)
        return lines_start, lines_start + (last - lines_start) // LINE_FLOATS * LINE_FLOATS

    @_jit
    def _scalar_range(acc, residual, grad, shift, first, last, scale, scan, threshold,
                      indices, values, count):
        """:func:`_stream_range` element by element, through the cache."""
        nonfinite = 0
        for i in range(first, last):
            value = residual[i] + grad[i - shift] * scale
            acc[i] = value
            nonfinite += not abs(value) <= FLOAT32_MAX
            if scan and abs(value) >= threshold:
                if count == indices.size:
                    indices, values = _grown(indices, values, count, count + 1)
                indices[count], values[count] = i, value
                count += 1
        return nonfinite, indices, values, count

    @_jit
    def _stream_lines(acc, residual, grad, shift, first, last, scale, scan, threshold, line,
                      indices, values):
        """:func:`_accumulate_line` over the whole lines ``[first, last)`` (aligned);
        with ``scan``, the hits are written into ``indices`` and ``values`` (room
        for every element) from 0.  Returns a count that is nonzero if any result
        is inf or NaN, and the number of hits.  (No buffer is replaced in this
        loop: numba would count references to it on every line.)"""
        nonfinite = count = 0
        for offset in range(first, last, LINE_FLOATS):
            bits = _accumulate_line(acc, residual, grad, line, offset, offset - shift, scale,
                                    threshold)
            nonfinite += bits >> LINE_FLOATS != 0
            hits = bits & LINE_HITS if scan else 0
            while hits:  # the set bits, lowest first
                j = trailing_zeros(hits)
                indices[count], values[count] = offset + j, line[j]
                count += 1
                hits &= hits - 1
        return nonfinite, count

    @_jit
    def _stream_range(acc, residual, grad, shift, first, last, scale, scan, threshold, chunk,
                      indices, values, count):
        """``acc[i] = residual[i] + grad[i - shift] * scale`` for ``i`` in ``[first,
        last)``, the whole lines ``STREAM_CHUNK`` elements at a time by
        :func:`_stream_lines` (``chunk``: its buffers); with ``scan``, append the
        ``(i, acc[i])`` with ``|acc[i]| >= threshold`` at ``count`` (the buffers
        grown as needed).  Returns a count that is nonzero if any result is inf
        or NaN, the buffers and the count of entries."""
        line, chunk_indices, chunk_values = chunk
        lines_start, lines_stop = _line_bounds(acc.ctypes.data, first, last)
        nonfinite, indices, values, count = _scalar_range(
            acc, residual, grad, shift, first, lines_start, scale, scan, threshold, indices,
            values, count)
        for chunk_start in range(lines_start, lines_stop, STREAM_CHUNK):
            bad, found = _stream_lines(acc, residual, grad, shift, chunk_start,
                                       min(chunk_start + STREAM_CHUNK, lines_stop), scale, scan,
                                       threshold, line, chunk_indices, chunk_values)
            nonfinite += bad
            if count + found > indices.size:
                indices, values = _grown(indices, values, count, count + found)
            indices[count:count + found] = chunk_indices[:found]
            values[count:count + found] = chunk_values[:found]
            count += found
        tail, indices, values, count = _scalar_range(
            acc, residual, grad, shift, lines_stop, last, scale, scan, threshold, indices,
            values, count)
        return nonfinite + tail, indices, values, count

    @_jit
    def _compiled_stream_accumulate(acc, residual, grad, scale):
        no_hits = np.empty(0, np.int64), np.empty(0, np.float32)
        chunk = np.empty(LINE_FLOATS, np.float32), *no_hits
        nonfinite = _stream_range(acc, residual, grad, 0, 0, acc.size, scale, False,
                                  np.float32(0), chunk, *no_hits, 0)[0]
        _store_fence()
        return nonfinite == 0

    @_jit
    def _compiled_stream_accumulate_scan(acc, residual, grad, scale, start, stop, lo, hi,
                                         threshold, capacity):
        chunk = (np.empty(LINE_FLOATS, np.float32), np.empty(STREAM_CHUNK, np.int64),
                 np.empty(STREAM_CHUNK, np.float32))
        indices, values = np.empty(capacity, np.int64), np.empty(capacity, np.float32)
        nonfinite, indices, values, count = _stream_range(
            acc, residual, grad, start, start, lo, scale, False, threshold, chunk, indices,
            values, 0)
        scanned, indices, values, count = _stream_range(
            acc, residual, grad, start, lo, hi, scale, True, threshold, chunk, indices, values,
            count)
        after, indices, values, count = _stream_range(
            acc, residual, grad, start, hi, stop, scale, False, threshold, chunk, indices,
            values, count)
        _store_fence()
        return nonfinite + scanned + after == 0, indices[:count], values[:count]

    @_jit
    def _compiled_stream_zero(data):
        head = min(-data.ctypes.data % LINE, data.size)  # bytes up to the first line
        data[:head] = 0
        lines_end = head + (data.size - head) // LINE * LINE
        for offset in range(head, lines_end, LINE):
            _stream_zero_line(data, offset)
        data[lines_end:] = 0
        _store_fence()

    @numba.njit(inline="always")  # compiled inside each caller, with the caller's flags
    def _sq_norm_lanes(x):
        # LANES interleaved float64 sums (independent, so they pipeline): lane j
        # takes x[i] for i = j mod LANES, in order; a float32's square is exact in
        # float64.  Rows of LANES keep the sums in registers.
        lanes = np.zeros(LANES)
        whole = x.size - x.size % LANES
        rows = x[:whole].reshape((whole // LANES, LANES))
        for r in range(rows.shape[0]):
            for j in range(LANES):
                value = np.float64(rows[r, j])
                lanes[j] += value * value
        for i in range(whole, x.size):
            value = np.float64(x[i])
            lanes[0] += value * value
        while lanes.size > 1:  # pairwise: ((l0 + l1) + (l2 + l3)) + ...
            lanes = lanes[0::2] + lanes[1::2]
        return lanes[0]

    @_jit_fused_multiply_add
    def _compiled_sq_norm32(x):
        return _sq_norm_lanes(x)

    @_jit
    def _compiled_sq_norm64(x):  # a float64's square is rounded: no fusing
        return _sq_norm_lanes(x)

    @_jit
    def _compiled_accumulate(acc, residual, grad, scale):
        nonfinite = 0
        for i in range(acc.size):
            value = residual[i] + grad[i] * scale
            acc[i] = value
            nonfinite += not abs(value) <= FLOAT32_MAX  # inf or NaN
        return nonfinite == 0

    @_jit
    def _compiled_accumulate_momentum(acc, residual, grad, scale, velocity_new, velocity_old,
                                      momentum, nesterov):
        nonfinite = 0
        for i in range(acc.size):
            scaled = grad[i] * scale
            velocity = velocity_old[i] * momentum + scaled
            velocity_new[i] = velocity
            if nesterov:
                velocity = velocity * momentum + scaled
            value = residual[i] + velocity
            acc[i] = value
            nonfinite += not abs(value) <= FLOAT32_MAX
        return nonfinite == 0

    @_jit
    def _compiled_stream_accumulate_momentum(acc, residual, grad, scale, velocity_new,
                                             velocity_old, momentum, nesterov):
        # the head and tail around the aligned lines element by element
        lines_start, lines_stop = _line_bounds(acc.ctypes.data, 0, acc.size)
        finite = _compiled_accumulate_momentum(
            acc[:lines_start], residual[:lines_start], grad[:lines_start], scale,
            velocity_new[:lines_start], velocity_old[:lines_start], momentum, nesterov)
        nonfinite = 0
        for offset in range(lines_start, lines_stop, LINE_FLOATS):
            nonfinite += _accumulate_momentum_line(acc, residual, grad, velocity_new,
                                                   velocity_old, offset, offset, scale,
                                                   momentum, nesterov) != 0
        tail_finite = _compiled_accumulate_momentum(
            acc[lines_stop:], residual[lines_stop:], grad[lines_stop:], scale,
            velocity_new[lines_stop:], velocity_old[lines_stop:], momentum, nesterov)
        _store_fence()
        return finite and nonfinite == 0 and tail_finite

    @_jit
    def _compiled_momentum_result(out, velocity, momentum, result):
        nonfinite = 0
        for i in range(result.size):
            value = velocity[i] * momentum + result[i]
            out[i] = value
            result[i] = value
            nonfinite += not abs(value) <= FLOAT32_MAX
        return nonfinite == 0

    @numba.njit(inline="always")
    def _row(coefficients, r):
        return (coefficients[r, 0], coefficients[r, 1], coefficients[r, 2], coefficients[r, 3],
                coefficients[r, 4], coefficients[r, 5])

    @_jit
    def _compiled_count_abs_ge_each(bits, padded_rungs, rung_count, first_rung, lowest_key,
                                    steps):
        # bucket b: b rungs are <= |x_i|; HISTOGRAMS interleaved copies, so that runs
        # of equal buckets do not wait on each other's increments
        per_bucket = np.zeros((HISTOGRAMS, rung_count + 1), np.int64)
        highest_key = lowest_key + first_rung.size - 1  # at most the largest finite key
        for i in range(bits.size):
            magnitude_bits = bits[i] & 0x7FFFFFFF
            key = magnitude_bits >> KEY_SHIFT
            if key < lowest_key:    # below the key of the lowest rung: under every rung
                bucket = 0
            elif key > highest_key:  # above every finite rung: inf over all, NaN under all
                bucket = rung_count if magnitude_bits <= INF_BITS else 0
            else:  # a finite magnitude: step over the rungs inside its key, branch-free
                bucket = first_rung[key - lowest_key]  # (+inf pads the end: never passed)
                magnitude = np.int32(magnitude_bits).view(np.float32)
                for _ in range(steps):
                    bucket += padded_rungs[bucket] <= magnitude
            per_bucket[i % HISTOGRAMS, bucket] += 1
        counts = np.zeros(rung_count, np.int64)
        above = 0
        for j in range(rung_count - 1, -1, -1):  # the count at rung j: buckets above j
            above += per_bucket[:, j + 1].sum()
            counts[j] = above
        return counts

    @_jit
    def _compiled_sketch_encode(x, coefficients, columns, table):
        rows = coefficients.shape[0]
        chunk = 1024
        hashed = np.empty(chunk, np.int64)  # (bucket << 1) | sign bit of one row's chunk
        for first in range(0, x.size, chunk):
            last = min(first + chunk, x.size)
            for r in range(rows):
                a, b, c3, c2, c1, c0 = _row(coefficients, r)
                for j in range(last - first):  # vectorizes: the hashing is pure arithmetic
                    bucket, parity = sketch_hash(first + j, a, b, c3, c2, c1, c0, columns)
                    hashed[j] = (bucket << 1) | parity
                base = r * columns
                for j in range(last - first):
                    value = x[first + j]
                    table[base + (hashed[j] >> 1)] += -value if hashed[j] & 1 else value

    @_jit
    def _compiled_sketch_estimate(table, start, stop, coefficients, columns, out):
        rows = coefficients.shape[0]
        chunk = 1024
        values = np.empty((rows, chunk), table.dtype)  # sign * bucket, a row per hash row
        for first in range(start, stop, chunk):
            size = min(first + chunk, stop) - first
            for r in range(rows):
                a, b, c3, c2, c1, c0 = _row(coefficients, r)
                for j in range(size):
                    bucket, parity = sketch_hash(first + j, a, b, c3, c2, c1, c0, columns)
                    value = table[r * columns + bucket]
                    values[r, j] = -value if parity else value
            for round_ in range(rows):  # odd-even transposition sort down the rows
                for r in range(round_ % 2, rows - 1, 2):
                    for j in range(size):
                        low, high = values[r, j], values[r + 1, j]
                        values[r, j], values[r + 1, j] = min(low, high), max(low, high)
            out[first - start:first - start + size] = values[(rows - 1) // 2, :size]


def count_abs_ge_each(x, thresholds):
    """int64 counts of ``|x_i| >= t`` for each of the ascending ``thresholds``
    (compared in ``x``'s precision; a NaN element counts at none), in one read of ``x``."""
    rungs = np.asarray(thresholds).astype(x.dtype)
    if np.isnan(rungs).any():
        raise ValueError(f"thresholds must be numbers, got NaN at positions "
                         f"{np.flatnonzero(np.isnan(rungs)).tolist()}")
    if numba is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        magnitude = np.sort(np.abs(x[~np.isnan(x)]))
        return (magnitude.size - np.searchsorted(magnitude, rungs, side="left")).astype(np.int64)
    # For each key (exponent and top mantissa bits) from the lowest rung's to the highest's,
    # the rungs below its smallest float: an element starts its search there and steps over
    # the one or two rungs inside its key.
    if rungs.size == 0:
        return np.zeros(0, np.int64)
    # The table ends at the largest finite key: an infinite rung lies above it, where
    # only inf reaches (and no finite magnitude steps onto the +inf padding).
    keys = (np.clip(rungs[[0, -1]], 0, FLOAT32_MAX).view(np.int32) & 0x7FFFFFFF) >> KEY_SHIFT
    key_floors = (np.arange(keys[0], keys[1] + 2, dtype=np.int32) << KEY_SHIFT).view(np.float32)
    rungs_below = np.searchsorted(rungs, key_floors, side="left").astype(np.int64)
    steps = int(np.diff(rungs_below).max())  # the most rungs inside one key
    padded = np.concatenate([rungs, np.full(steps, np.inf, rungs.dtype)])
    return _compiled_count_abs_ge_each(x.view(np.int32), padded, rungs.size, rungs_below[:-1],
                                       np.int64(keys[0]), steps)


def _check_lengths(*vectors):
    """Raise ``ValueError`` unless the vectors (``None`` skipped) are one length:
    the compiled loops index them all by one counter, and numba checks no bounds."""
    length = vectors[0].shape[0]
    if any(x is not None and x.shape[0] != length for x in vectors):
        raise ValueError("vectors of one length expected, got lengths "
                         f"{[x.shape[0] for x in vectors if x is not None]}")


def _check_range(size, *bounds):
    """Raise ``ValueError`` unless ``0 <= bounds[0] <= bounds[1] <= ... <= size``."""
    points = (0, *bounds, size)
    if any(a > b for a, b in zip(points, points[1:])):
        raise ValueError(f"range bounds {bounds} do not lie in order inside [0, {size}]")


def _check_table(table, coefficients, columns):
    """Raise ``ValueError`` unless the flat sketch ``table`` holds a row of
    ``columns`` for each row of hash ``coefficients``."""
    if table.shape[0] != coefficients.shape[0] * columns:
        raise ValueError(f"a sketch table of {coefficients.shape[0]} rows x {columns} columns "
                         f"expected, got {table.shape[0]} elements")


def sketch_compiled(x):
    """Whether the compiled sketch kernels take the host vector ``x``."""
    return numba is not None and x.dtype == np.float32 and x.flags.c_contiguous


def sketch_encode(x, coefficients, columns, table):
    """Add the float32 vector ``x`` (coordinates ``0..x.size-1``) into the flat
    Count Sketch ``table`` (``rows x columns``, row-major) in place; each bucket
    sums its coordinates in ascending order."""
    _check_table(table, coefficients, columns)
    _check_range(HASH_PRIME, x.shape[0])  # the hash takes coordinates below p
    _compiled_sketch_encode(x, coefficients, np.int64(columns), table)


def sketch_estimate(table, start, stop, coefficients, columns):
    """Lower median over rows of ``sign * bucket`` for the coordinates ``[start, stop)``."""
    _check_table(table, coefficients, columns)
    _check_range(HASH_PRIME, start, stop)  # the hash takes coordinates below p
    out = np.empty(stop - start, table.dtype)
    _compiled_sketch_estimate(table, start, stop, coefficients, np.int64(columns), out)
    return out


def _capacity(expected, size):
    """Entries to make room for up front: the ``expected`` hits, at least
    ``MIN_CAPACITY``, at most the ``size`` of the range (and at least one)."""
    return max(1, min(max(int(expected), MIN_CAPACITY), size))


def abs_ge_entries(x, threshold, start, stop, expected=0):
    """``(i, x[i])`` for the ``i`` in ``[start, stop)`` with ``|x[i]| >= threshold``
    (int64 indices ascending, and their values), the threshold compared in
    ``x``'s precision.  ``expected`` (a hint, any value is correct) sizes the
    output up front: each time it overflows it is copied into one twice as
    large, which on a million entries costs more than the scan."""
    threshold = x.dtype.type(threshold)
    if stop > start:
        _check_range(x.shape[0], start, stop)
    if (numba is None or x.dtype not in _COMPILED_DTYPES or stop - start <= 0
            or not x.flags.c_contiguous):
        return _numpy_abs_ge_entries(x, threshold, start, stop)
    return _compiled_abs_ge_entries(x, threshold, start, stop, _capacity(expected, stop - start))


def accumulate_scan(acc, residual, grad, scale, start, stop, lo, hi, threshold, expected=0):
    """:func:`accumulate` of one gradient into ``acc[start:stop]`` (``residual``
    and ``acc`` whole vectors, ``grad`` the gradient; no momentum) that also
    returns :func:`abs_ge_entries` of ``acc`` over ``[lo, hi)`` (inside
    ``[start, stop)``): ``(all finite, indices, values)``.  The compiled path
    scans each chunk of ``acc`` right after writing it, while it is still in
    the cache, so collecting costs no second read from memory."""
    _check_range(acc.shape[0], start, lo, hi, stop)
    _check_lengths(acc, residual)
    if grad.shape[0] != stop - start:
        raise ValueError(f"a gradient of {stop - start} elements expected, got {grad.shape[0]}")
    compiled = numba is not None and acc.flags.c_contiguous and acc.dtype == np.float32 and (
        grad.dtype == np.float32)
    if not compiled:
        finite = accumulate(acc[start:stop], residual[start:stop], grad, scale)
        return (finite, *abs_ge_entries(acc, threshold, lo, hi, expected))
    kernel = (_compiled_stream_accumulate_scan if _streamed(acc[start:stop], residual, grad)
              else _compiled_accumulate_scan)
    return kernel(acc, residual, grad, np.float32(scale), start, stop, lo, hi,
                  np.float32(threshold), _capacity(expected, hi - lo))


def _streamed(acc, residual, grad, velocity_new=None, velocity_old=None):
    """Whether ``acc`` (and ``velocity_new``) are written with streaming stores: a
    slice this large would not stay in the cache anyway, and a plain store first
    reads each line.  Every vector is read or written a line at a time as
    float32s (contiguous, aligned float32), and the two written vectors must
    start alike within a line (torch aligns every buffer to 64 bytes; others
    take the loop through the cache)."""
    vectors = [x for x in (acc, residual, grad, velocity_new, velocity_old) if x is not None]
    if not all(x.dtype == np.float32 and x.flags.c_contiguous and x.flags.aligned
               for x in vectors):
        return False
    if velocity_new is not None and (velocity_new.ctypes.data - acc.ctypes.data) % LINE:
        return False
    return acc.nbytes >= STREAM_MIN_BYTES


def abs_ge_indices(x, threshold, start, stop):
    """The indices of :func:`abs_ge_entries`."""
    return abs_ge_entries(x, threshold, start, stop)[0]


def fill_zero(x):
    """Zero the vector ``x`` in place.  A large contiguous one is written with
    streaming stores, straight to memory: a plain store first reads each line
    it writes, so this is about twice as fast (and leaves ``x`` out of the
    caches, where a buffer this size would not stay anyway)."""
    if numba is None or x.nbytes < STREAM_MIN_BYTES or not x.flags.c_contiguous:
        x.fill(0)
    else:
        _compiled_stream_zero(x.reshape(-1).view(np.uint8))


def sq_norm(x):
    """``sum_i x_i^2`` of the vector ``x`` as a Python float, accumulated in float64
    without a float64 copy of ``x`` (the numpy path casts a chunk at a time)."""
    if numba is not None and x.dtype in _COMPILED_DTYPES and x.flags.c_contiguous:
        compiled = _compiled_sq_norm32 if x.dtype == np.float32 else _compiled_sq_norm64
        return float(compiled(x.reshape(-1)))
    total = 0.0
    for first in range(0, x.shape[0], SCAN_CHUNK):
        chunk = x[first:first + SCAN_CHUNK].astype(np.float64)
        total += float(np.dot(chunk, chunk))
    return total


def all_finite(x):
    """Whether every element of the vector ``x`` is finite."""
    if numba is None or x.dtype not in _COMPILED_DTYPES or not x.flags.c_contiguous:
        return bool(np.isfinite(x).all())
    if x.dtype == np.float32:
        return _compiled_nonfinite32(x.reshape(-1).view(np.int32)) == 0
    return _compiled_nonfinite64(x.reshape(-1).view(np.int64)) == 0


def momentum_result(out, velocity, momentum, result):
    """Momentum SGD on an averaged gradient: ``out = momentum * velocity + result``
    (each product and sum rounded, as numpy's two operations), then ``result =
    out`` (a copy), in one pass; return whether every element of ``result`` is
    finite.  Vectors of one length (compiled where all are C-contiguous float32;
    others through numpy)."""
    _check_lengths(out, velocity, result)
    compiled = numba is not None and all(x.dtype == np.float32 and x.flags.c_contiguous
                                         for x in (out, velocity, result))
    if not compiled:
        np.multiply(velocity, velocity.dtype.type(momentum), out=out)
        np.add(out, result, out=out)
        np.copyto(result, out)
        return bool(np.isfinite(result).all())
    return _compiled_momentum_result(out, velocity, np.float32(momentum), result)


def accumulate(acc, residual, grad, scale=1.0, velocity_new=None, velocity_old=None,
               momentum=0.0, nesterov=False):
    """``acc = residual + scale * grad`` in place (with momentum correction
    ``velocity_new = momentum * velocity_old + scale * grad`` and
    ``acc = residual + velocity_new``; Nesterov: ``acc = residual + momentum *
    velocity_new + scale * grad``); return whether every ``acc`` is finite.
    ``grad`` may be ``acc`` itself (each element is read before it is written).

    All arrays are float32 slices of one length; each product and sum is
    rounded to float32 (no fused multiply-add), as the numpy expression would.
    """
    _check_lengths(acc, residual, grad, velocity_new, velocity_old)
    compiled = numba is not None and acc.flags.c_contiguous and acc.dtype == np.float32 and (
        grad.dtype == np.float32)
    if not compiled:
        return _numpy_accumulate(acc, residual, grad, scale, velocity_new, velocity_old,
                                 momentum, nesterov)
    scale = np.float32(scale)
    if velocity_new is None:
        kernel = (_compiled_stream_accumulate if _streamed(acc, residual, grad)
                  else _compiled_accumulate)
        return kernel(acc, residual, grad, scale)
    kernel = (_compiled_stream_accumulate_momentum
              if _streamed(acc, residual, grad, velocity_new, velocity_old)
              else _compiled_accumulate_momentum)
    return kernel(acc, residual, grad, scale, velocity_new, velocity_old, np.float32(momentum),
                  bool(nesterov))
