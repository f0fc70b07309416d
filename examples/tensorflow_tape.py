"""The getting-started TensorFlow example: Horovod's tape with a horovod_sparse compressor.

    horovodrun -np 2 python examples/tensorflow_tape.py
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Keras 2: Horovod 0.28 cannot take Keras 3 variables

import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
import horovod_sparse.tensorflow as hs  # noqa: E402

hvd.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
model.build((None, 1000))
compression = hs.Compression.exdyna(density=0.001)
optimizer = tf.keras.optimizers.SGD(0.1)


@tf.function                                   # or eagerly: works the same
def step(x, y, first_batch):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.mse(y, model(x)))
    tape = hvd.DistributedGradientTape(tape, compression=compression, groups=1)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables(), root_rank=0)
    return loss


for batch in range(20):
    loss = step(tf.random.normal([8, 1000]), tf.random.normal([8, 10]), batch == 0)
if hvd.rank() == 0:
    summary = compression.summary()
    print(f"loss {float(loss):.4f}; density {summary['density_mean']:.5f}, "
          f"{summary['bytes_sent_mean']:,.0f} bytes sent per step")
