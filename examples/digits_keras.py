"""Train an MLP on the bundled digits with Horovod's Keras API (TensorFlow), dense or sparse.

    horovodrun -np 4 python examples/digits_keras.py --compression exdyna --density 0.01

The same task, model and schedule as ``digits.py`` (PyTorch): each rank fits
its shard with ``model.fit``; Horovod's Keras ``DistributedOptimizer`` (with
``groups=1``: horovod_sparse needs every gradient of a step at once) averages
the gradients, densely (``--compression dense``) or through a horovod_sparse
compressor; Horovod's callbacks broadcast the initial weights and average the
metrics.  Rank 0 prints test accuracy per epoch and a summary.

Keras: TensorFlow 2.21 ships Keras 3, which Horovod 0.28's Keras integration
does not support.  This script uses Keras 2 (``pip install tf_keras``) by
setting ``TF_USE_LEGACY_KERAS=1`` before TensorFlow is imported; do the same
in your own scripts.  Horovod 0.28's Keras callbacks bind Keras 3's backend
even then; the script points them at Keras 2's (``hvd_callbacks.K``).
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before tensorflow: Keras 2 (tf_keras)

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import horovod.tensorflow.keras.callbacks as hvd_callbacks  # noqa: E402

hvd_callbacks.K = tf.keras.backend  # Horovod's callbacks: Keras 2's backend, not Keras 3's

import horovod_sparse  # noqa: E402
import horovod_sparse.tensorflow as hs  # noqa: E402
from digits_common import (DENSE, add_training_arguments, canonical,  # noqa: E402
                           dense_summary, load_split, report, sparse_summary)


def make_model(hidden=256):
    return tf.keras.Sequential([tf.keras.layers.Dense(hidden, activation="relu", input_shape=(64,)),
                                tf.keras.layers.Dense(hidden, activation="relu"),
                                tf.keras.layers.Dense(10)])


class _Progress(tf.keras.callbacks.Callback):
    """Test accuracy after every epoch and the time of every training step."""

    def __init__(self, x_test, y_test, label, verbose):
        super().__init__()
        self.x_test, self.y_test, self.label, self.verbose = x_test, y_test, label, verbose
        self.accuracies, self.step_times, self._start = [], [], None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step_times.append(time.perf_counter() - self._start)

    def on_epoch_end(self, epoch, logs=None):
        logits = self.model(self.x_test, training=False)
        accuracy = float(np.mean(np.argmax(logits, axis=1) == self.y_test))
        self.accuracies.append(accuracy)
        if self.verbose and hvd.rank() == 0:
            print(f"[{self.label}] epoch {epoch + 1:3d}/{self.params['epochs']}  "
                  f"test accuracy {accuracy:.4f}", flush=True)


def train(compression="dense", density=0.01, epochs=30, batch_size=16, lr=0.05, seed=0,
          verbose=True):
    """Fit once; return a summary dict like ``digits.train``'s."""
    compression = canonical(compression)
    tf.keras.utils.set_random_seed(seed)
    x_train, y_train, x_test, y_test = load_split()
    rank, size = hvd.rank(), hvd.size()
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    steps_per_epoch = len(y_shard) // batch_size
    x_shard, y_shard = x_shard[:steps_per_epoch * batch_size], y_shard[:steps_per_epoch * batch_size]
    model = make_model()
    compressor, momentum = hvd.Compression.none, 0.9
    if compression != DENSE:
        compressor = hs.Compression.create(compression, density=density)
        momentum = 0.0 if compressor.owns_momentum else 0.9  # DGC, gs-SGD: inside
    schedule = tf.keras.optimizers.schedules.CosineDecay(lr, decay_steps=epochs * steps_per_epoch)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(schedule, momentum=momentum),
                                         compression=compressor, groups=1)
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    progress = _Progress(x_test, y_test, compression, verbose)
    model.fit(x_shard, y_shard, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(), progress])
    n = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    times = np.array(progress.step_times[steps_per_epoch:] or progress.step_times)
    summary = {"method": compression, "framework": "tensorflow-keras",
               "density_target": density if compression != DENSE else 1.0, "ranks": size,
               "parameters": n, "accuracy": progress.accuracies[-1],
               "best_accuracy": max(progress.accuracies), "accuracies": progress.accuracies,
               "samples_per_second": float(batch_size * size / times.mean()),
               "step_ms": float(1000 * times.mean())}
    summary.update(dense_summary(n) if compression == DENSE else sparse_summary(compressor.history))
    return summary, model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compression", default="exdyna", help="dense (or none) or a "
                        "horovod_sparse method (" + ", ".join(horovod_sparse.available()) + ")")
    add_training_arguments(parser)
    args = parser.parse_args()
    hvd.init()
    summary, _ = train(args.compression, args.density, args.epochs, args.batch_size, args.lr)
    if hvd.rank() == 0:
        report(summary, args.json)


if __name__ == "__main__":
    main()
