"""tnt on Keras' torch or JAX backend against serial Keras on the same backend, on the GPU when
there is one.

Run by ``benchmarks/gpu/run.sh`` (2 ranks sharing one GPU); runs on CPUs too, for a rehearsal:
``KERAS_BACKEND=torch tnt-launch -n 2 -- python benchmarks/gpu/equal_job.py OUT_DIR`` (on JAX with
``JAX_ENABLE_X64=1``, without which JAX computes the float64 reference in float32).

Rank 0 also trains the model serially, twice: in float32 (what tnt must equal) and in float64 (the
reference both float32 runs approach). cuDNN's kernels and tnt's sum round differently from serial
float32, so exact equality cannot hold; the bound says how far tnt may be from the float64 run:
no farther than 4 times serial float32's own distance from it, plus 64 float32 ulps of the largest
weight (the rounding of one more order of summation, over the steps). A wrong gradient sum (a
share of the batch lost, a wrong scale) moves the weights by far more. The ranks' weights must be
bitwise equal to each other. Prints one JSON line and writes OUT_DIR/equal.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib

import keras
import numpy as np
import tnt_comm
import tnt_keras as tnt
from tnt_keras import state as tnt_state

BACKEND = keras.backend.backend()

ROWS, BATCH, EPOCHS = 257, 32, 3  # 257 = 8 * 32 + 1: the last global batch leaves rank 1 an empty slice
SHAPE, CLASSES = (16, 16, 3), 10


def model(dtype: str) -> keras.Model:
    keras.utils.set_random_seed(7)  # the same initial weights in every run
    layers = [
        keras.Input(SHAPE, dtype=dtype),
        keras.layers.Conv2D(16, 3, activation="relu", dtype=dtype),
        keras.layers.MaxPooling2D(dtype=dtype),
        keras.layers.Conv2D(32, 3, activation="relu", dtype=dtype),
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(64, activation="relu", dtype=dtype),
        keras.layers.Dense(CLASSES, dtype=dtype),
    ]
    built = keras.Sequential(layers)
    built.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return built


def data(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((ROWS, *SHAPE)).astype(dtype)
    y = rng.integers(0, CLASSES, ROWS).astype("int32")
    return x, y


OVERLAP: dict[str, int] = {}


def train(dtype: str, wrap: bool) -> tuple[list[np.ndarray], dict, float]:
    m = model(dtype)
    if dtype != "float32":  # initializers draw other numbers in float64: start from float32's weights
        m.set_weights([w.astype(dtype) for w in model("float32").get_weights()])
    if wrap:
        m = tnt.Model(m)
    x, y = data(dtype)
    begin = time.perf_counter()
    history = m.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0).history
    seconds = time.perf_counter() - begin
    summing = tnt_state.of(m.model).gradient_sum if wrap and BACKEND == "torch" else None
    if summing is not None:  # how many gradients the hooks handed over while backward still ran
        OVERLAP["in_backward"] = sum(p.started_in_backward for p in summing.plans.values())
        OVERLAP["gradients_per_step"] = sum(len(p.variables) for p in summing.plans.values())
    return [np.asarray(w, dtype=np.float64) for w in m.get_weights()], history, seconds


def device_name() -> str:
    """The GPU this rank computes on, or "cpu"."""
    if BACKEND == "torch":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    import jax

    device = jax.devices()[0]
    return device.device_kind if device.platform == "gpu" else "cpu"


def distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.max(np.abs(x - y)) for x, y in zip(a, b, strict=True)))


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    if BACKEND == "jax" and not keras.ops.convert_to_tensor(np.zeros(1, np.float64)).dtype == "float64":
        raise SystemExit("equal_job.py on JAX needs JAX_ENABLE_X64=1 for its float64 reference")
    mine, history, tnt_seconds = train("float32", wrap=True)
    checksum = zlib.crc32(b"".join(w.astype(np.float32).tobytes() for w in mine))
    everyone = tnt_comm.allgather(np.array([checksum], dtype=np.int64)).ravel().tolist()
    report = {
        "rank": tnt.get_rank(),
        "size": tnt.get_size(),
        "backend": BACKEND,
        "device": device_name(),
        "weights_on": str(keras.ops.convert_to_tensor(np.zeros(1)).device),
        "ranks_bitwise_equal": len(set(everyone)) == 1,
        "tnt_fit_s": round(tnt_seconds, 3),
        "tnt_loss": history["loss"],
        "started_in_backward": OVERLAP,
    }
    if tnt.get_rank() == 0:
        serial32, serial_history, serial_seconds = train("float32", wrap=False)
        serial64, _, _ = train("float64", wrap=False)
        scale = max(float(np.max(np.abs(w))) for w in serial64)
        serial_err = distance(serial32, serial64)
        bound = 4 * serial_err + 64 * float(np.finfo(np.float32).eps) * scale
        report.update(
            {
                "serial_fit_s": round(serial_seconds, 3),
                "serial_loss": serial_history["loss"],
                "serial32_vs_64": serial_err,
                "tnt_vs_64": distance(mine, serial64),
                "tnt_vs_serial32": distance(mine, serial32),
                "bound": bound,
                "equal_within_bound": distance(mine, serial64) <= bound,
            }
        )
        with open(os.path.join(out, "equal.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
