# The TF_CONFIG snippet of the Lightning guide (../shared/seed/multi-node-training.md, "TensorFlow"), below this
# header unchanged but for the one line it forgot: `import json`. It builds TF_CONFIG from MASTER_ADDR:MASTER_PORT
# once per worker, which is wrong (docs/frameworks.md, Known traps); mmt names that at once. Kept as the guide has it:
# ruff: noqa
# fmt: off
import json
import os
import tensorflow as tf

# Environment variables setup for distributed training
os.environ['TF_CONFIG'] = json.dumps({
    'cluster': {
        'worker': [f"{os.getenv('MASTER_ADDR')}:{os.getenv('MASTER_PORT')}" for _ in range(int(os.getenv('WORLD_SIZE')))]
    },
    'task': {'type': 'worker', 'index': int(os.getenv('RANK'))}
})

# Setting up the strategy for multi-worker training
strategy = tf.distribute.MultiWorkerMirroredStrategy()

# Example of model building and training inside the strategy scope
with strategy.scope():
    # Model definition
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(10, activation='relu', input_shape=(20,)),
        tf.keras.layers.Dense(1)
    ])

    # Compile the model
    model.compile(optimizer='adam',
                  loss='mse')

    # Example dataset
    import numpy as np
    x = np.random.random((100, 20))
    y = np.random.random((100, 1))

    # Train the model
    model.fit(x, y, epochs=10, batch_size=5)
