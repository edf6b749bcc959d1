"""Custom train_steps beyond one optimizer: two optimizers held as attributes (as GANs do), and a
step that changes a variable without the gradient sum, which tnt must report."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
from typing import Any

import keras
import tnt_keras as tnt
from _job import CLASSES, dataset, flat, max_diff, report


class TwoOptimizers(keras.Model):
    """Its own compile takes two optimizers: one for the hidden layer, one for the output layer."""

    def __init__(self, rogue: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(CLASSES)
        self.rogue = rogue

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))

    def compile(self, hidden_optimizer: Any, out_optimizer: Any, loss: Any) -> None:
        super().compile(loss=loss)
        self.hidden_optimizer = hidden_optimizer
        self.out_optimizer = out_optimizer
        self.loss_fn = loss

    def train_step(self, data: Any) -> Any:
        x, y = data
        if keras.backend.backend() == "torch":
            import torch

            self.zero_grad()
            loss = self.loss_fn(y, self(x, training=True))
            hidden, out = self.hidden.trainable_variables, self.out.trainable_variables  # built by now
            loss.backward()
            grads = [v.value.grad for v in hidden + out]
            with torch.no_grad():
                self.hidden_optimizer.apply(grads[: len(hidden)], hidden)
                self.out_optimizer.apply(grads[len(hidden) :], out)
        else:
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self(x, training=True))
            hidden, out = self.hidden.trainable_variables, self.out.trainable_variables  # built by now
            grads = tape.gradient(loss, hidden + out)
            self.hidden_optimizer.apply(grads[: len(hidden)], hidden)
            self.out_optimizer.apply(grads[len(hidden) :], out)
        if self.rogue:  # a rank-dependent change that no collective sees
            self.out.bias.assign(self.out.bias + keras.ops.full(self.out.bias.shape, 1e-3 * tnt.get_rank()))
        return {"loss": loss}


def compiled(model: keras.Model) -> keras.Model:
    model.compile(
        hidden_optimizer=keras.optimizers.Adam(0.01),
        out_optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


keras.utils.set_random_seed(7)
serial = compiled(TwoOptimizers())
serial.fit(dataset(75, 7, seed=5), epochs=3, shuffle=False, verbose=0)
keras.utils.set_random_seed(7)
model = compiled(tnt.Model(TwoOptimizers()))
model.fit(dataset(75, 7, seed=5), epochs=3, shuffle=False, verbose=0)
result = {
    "two_err": max_diff(serial.get_weights(), model.get_weights()),
    "two_weights": flat(model.get_weights()),
    "two_hidden_iterations": int(model.model.hidden_optimizer.iterations.numpy()),
}

print("ROGUE FIT STARTS", flush=True)
rogue = compiled(tnt.Model(TwoOptimizers(rogue=True)))
rogue.fit(dataset(60, 12, seed=5), epochs=1, verbose=0)
report(result)
