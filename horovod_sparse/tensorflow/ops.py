"""``ArrayOps`` over TensorFlow: buffers are ``tf.Variable``s updated in place."""

import numpy as np
import tensorflow as tf

from ..core.ops import ArrayOps


class TensorFlowOps(ArrayOps):
    chunk = 1 << 20  # elements cast to float64 at a time by segment_sq_norms

    def zeros(self, n, like):
        with tf.device(like.device):
            return tf.Variable(tf.zeros([n], dtype=tf.float32), trainable=False)

    def fill_zero(self, x):
        x.assign(tf.zeros_like(x))

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

    def astype(self, x, dtype):
        return tf.cast(x, dtype)

    def scatter_add(self, dense, indices, values):
        dense.scatter_nd_add(indices[:, None], tf.cast(values, dense.dtype))

    def concat(self, vectors):
        return tf.concat(vectors, 0)

    def divide(self, x, divisor):
        return tf.convert_to_tensor(x) / tf.cast(divisor, x.dtype)

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
        chunk = self.chunk  # no float64 copy of a whole segment
        return np.array([sum(float(tf.reduce_sum(tf.square(tf.cast(x[first:min(first + chunk, e)],
                                                                  tf.float64))))
                             for first in range(s, e, chunk)) for s, e in bounds],
                        dtype=np.float64)

    def scale_add_slice(self, out, x, factor, y, start, stop):
        scaled = x[start:stop] * tf.cast(factor, out.dtype)
        out[start:stop].assign(scaled + tf.cast(y, out.dtype))

    def copy_slice(self, out, x, start, stop):
        out[start:stop].assign(tf.cast(x, out.dtype))

    def multiply(self, x, factor):
        x = tf.convert_to_tensor(x)
        return x * tf.cast(factor, x.dtype)

    def unique(self, indices):
        return tf.sort(tf.unique(indices).y)

    def merge_sum(self, indices_a, values_a, indices_b, values_b):
        indices = tf.concat([indices_a, indices_b], 0)
        order = tf.argsort(indices, stable=True)
        merged, position = tf.unique(tf.gather(indices, order))
        values = tf.math.unsorted_segment_sum(tf.gather(tf.concat([values_a, values_b], 0), order),
                                              position, tf.size(merged))
        return merged, values

    def median_rows(self, rows):
        return tf.sort(tf.stack(rows), axis=0)[(len(rows) - 1) // 2]
