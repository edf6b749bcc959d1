"""Train a small CNN on scikit-learn's 8x8 digits with tnt, data-parallel. Run with:

tnt-launch -n 2 -- examples/keras_digits.py
KERAS_BACKEND=torch tnt-launch -n 2 -- examples/keras_digits.py     # on Keras' torch backend

or as one rank with `python examples/keras_digits.py`. Every rank trains on its slice of each global
batch of 64 and the gradients are summed, so the printed numbers match a one-rank run up to
floating-point rounding.
"""

import keras
import numpy as np
import tnt_keras as tnt
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

BATCH_SIZE = 64  # the GLOBAL batch size, shared by all ranks
SEED = 42

# The same seed on every rank. (The initial weights need no care: every rank takes rank 0's when fit
# starts, and tnt shuffles the arrays alike on every rank.)
keras.utils.set_random_seed(SEED)

# 1797 images of 8x8 pixels with values 0..16, labels 0..9.
x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype("float32").reshape(-1, 8, 8, 1)
y = y.astype("int32")
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
x_train, x_val, y_train, y_val = train_test_split(x_train, y_train, test_size=0.1, random_state=SEED)


keras_model = keras.Sequential(
    [
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)

model = tnt.Model(keras_model)
model.compile(
    optimizer=keras.optimizers.Adam(learning_rate=3e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)

if tnt.is_master_rank():
    print(f"training on {tnt.get_size()} rank(s), global batch {BATCH_SIZE}, {len(x_train)} images")

callbacks = [
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2),
]
# batch_size is the global batch size; tnt hands every rank its slice of each batch.
history = model.fit(
    x_train,
    y_train,
    batch_size=BATCH_SIZE,
    validation_data=(x_val, y_val),
    epochs=20,
    callbacks=callbacks,
    verbose=2,
)

loss, accuracy = model.evaluate(x_test, y_test, batch_size=BATCH_SIZE, verbose=0)

# predict returns the predictions for all samples, in order, on every rank.
probabilities = model.predict(x_test[:8], batch_size=8, verbose=0)
predicted = np.argmax(probabilities, axis=1)

if tnt.is_master_rank():
    print(f"trained {len(history.history['loss'])} epochs")
    print(f"predicted {predicted.tolist()}")
    print(f"true      {y_test[:8].tolist()}")
    print(f"test accuracy {accuracy:.3f}")
