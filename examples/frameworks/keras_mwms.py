"""A Keras model trained with TensorFlow's MultiWorkerMirroredStrategy: no TF_CONFIG code, no rank arithmetic.

Run it as one TensorFlow worker per rank, with mmt writing every worker's TF_CONFIG:

    python train.py -m command='python examples/frameworks/keras_mwms.py' command_mode=per_rank \\
        num_nodes=2 devices=1 hydra.launcher.framework=tensorflow +env.TF_USE_LEGACY_KERAS=1

TF_USE_LEGACY_KERAS=1 picks tf-keras (Keras 2): Keras 3's model.fit fails under this strategy (keras #20585,
tensorflow #72388). See docs/frameworks.md. Every worker prints one line at the end: its index, its last loss and a
digest of its weights (the same on every worker: the strategy keeps them in sync).
"""

import hashlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines are many; warnings and errors stay

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS, STEPS, GLOBAL_BATCH = 3, 8, 32


def dataset() -> tf.data.Dataset:
    """The same synthetic regression data on every worker; the strategy gives each worker its shard of a batch."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EPOCHS * STEPS * GLOBAL_BATCH, 20)).astype("float32")
    y = (x @ rng.normal(size=(20, 1)) + 0.1).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat().with_options(options)


def main() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG: every worker's own host:port
    resolver = strategy.cluster_resolver
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential(
            [tf.keras.layers.Dense(16, activation="relu", input_shape=(20,)), tf.keras.layers.Dense(1)]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(dataset(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=2)
    digest = hashlib.sha256(b"".join(np.round(w, 5).tobytes() for w in model.get_weights())).hexdigest()[:16]
    losses = history.history["loss"]
    print(
        f"worker {resolver.task_id} of {strategy.num_replicas_in_sync} done: loss {losses[0]:.4f} -> "
        f"{losses[-1]:.4f}, weights {digest}",
        flush=True,
    )


if __name__ == "__main__":
    main()
