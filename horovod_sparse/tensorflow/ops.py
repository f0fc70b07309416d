"""``ArrayOps`` over TensorFlow: buffers are ``tf.Variable``s updated in place."""

import numpy as np
import tensorflow as tf

from ..core.ops import ArrayOps


class TensorFlowOps(ArrayOps):
    def zeros(self, n, like):
        with tf.device(like.device):
            return tf.Variable(tf.zeros([n], dtype=tf.float32), trainable=False)

    def add_slice(self, out, a, b, start, stop):
        out[start:stop].assign(a[start:stop] + tf.cast(b, out.dtype))

    def fill_zero(self, x):
        x.assign(tf.zeros_like(x))

    def all_finite(self, x):
        return bool(tf.reduce_all(tf.math.is_finite(x)))

    def abs_ge_indices(self, x, threshold, start, stop):
        magnitude = tf.abs(x[start:stop])
        return tf.where(magnitude >= tf.cast(threshold, magnitude.dtype))[:, 0] + start

    def topk_abs_indices(self, x, k, start, stop):
        magnitude = tf.abs(x[start:stop])
        size = int(magnitude.shape[0])
        if k >= size:
            return tf.range(start, stop, dtype=tf.int64)
        if k <= 0:
            return tf.zeros([0], dtype=tf.int64)
        kth = tf.math.top_k(magnitude, k, sorted=True).values[-1]
        above = tf.where(magnitude > kth)[:, 0]
        tied = tf.where(magnitude == kth)[:, 0][:k - int(tf.size(above))]
        return tf.sort(tf.concat([above, tied], 0)) + start  # ties: lowest indices

    def take(self, x, indices):
        return tf.gather(x, indices)

    def zero_at(self, x, indices):
        x.scatter_nd_update(indices[:, None], tf.zeros(tf.shape(indices), dtype=x.dtype))

    def keep_rounding_error(self, x, indices, dtype):
        values = tf.gather(x, indices)
        x.scatter_nd_update(indices[:, None], values - tf.cast(tf.cast(values, dtype), x.dtype))

    def to_wire(self, values, dtype):
        return tf.cast(values, dtype)

    def from_wire(self, values):
        return tf.cast(values, tf.float32)

    def scatter_add(self, dense, indices, values):
        dense.scatter_nd_add(indices[:, None], tf.cast(values, dense.dtype))

    def concat(self, vectors):
        return tf.concat(vectors, 0)

    def divide(self, x, divisor):
        return tf.convert_to_tensor(x) / tf.cast(divisor, x.dtype)

    def count_abs_ge_each(self, x, thresholds):
        magnitude = tf.sort(tf.abs(x))
        rungs = tf.constant(np.asarray(thresholds), dtype=magnitude.dtype)
        below = tf.searchsorted(magnitude, rungs, side="left", out_type=tf.int64)
        return (int(tf.size(magnitude)) - below).numpy().astype(np.int64)

    def select_abs_ge(self, indices, values, threshold):
        return tf.boolean_mask(indices, tf.abs(values) >= tf.cast(threshold, values.dtype))

    def count_unique(self, indices):
        return int(tf.size(tf.unique(indices).y))

    def narrow_index(self, indices):
        return tf.cast(indices, tf.int32)

    def widen_index(self, indices):
        return tf.cast(indices, tf.int64)

    def arange(self, start, stop, like):
        return tf.range(start, stop, dtype=tf.int64)

    def to_host(self, x):
        return np.asarray(x.numpy())

    def from_host(self, array, like=None):
        device = like.device if like is not None else "/cpu:0"
        with tf.device(device):
            return tf.Variable(np.ascontiguousarray(array), trainable=False)

    def segment_sq_norms(self, x, bounds):
        if not bounds:
            return np.zeros(0, dtype=np.float64)
        return np.array([float(tf.reduce_sum(tf.square(tf.cast(x[s:e], tf.float64))))
                         for s, e in bounds], dtype=np.float64)

    def scale_add_slice(self, out, x, factor, y, start, stop):
        scaled = x[start:stop] * tf.cast(factor, out.dtype)
        out[start:stop].assign(scaled + tf.cast(y, out.dtype))

    def multiply(self, x, factor):
        x = tf.convert_to_tensor(x)
        return x * tf.cast(factor, x.dtype)

    def unique(self, indices):
        return tf.sort(tf.unique(indices).y)

    def intersect(self, a, b):
        if int(tf.size(b)) == 0:
            return a[:0]
        position = tf.minimum(tf.searchsorted(b, a, side="left"), tf.cast(tf.size(b) - 1, tf.int32))
        return tf.boolean_mask(a, tf.gather(b, position) == a)

    def merge_sum(self, indices_a, values_a, indices_b, values_b):
        indices = tf.concat([indices_a, indices_b], 0)
        order = tf.argsort(indices, stable=True)
        merged, position = tf.unique(tf.gather(indices, order))
        values = tf.math.unsorted_segment_sum(tf.gather(tf.concat([values_a, values_b], 0), order),
                                              position, tf.size(merged))
        return merged, values

    def add_at(self, dense, indices, values):
        dense.scatter_nd_add(indices[:, None], tf.cast(values, dense.dtype))

    def median_rows(self, rows):
        return tf.sort(tf.stack(rows), axis=0)[(len(rows) - 1) // 2]

    def max_abs(self, x):
        return float(tf.reduce_max(tf.abs(x))) if int(tf.size(x)) else 0.0
