"""Trains every kind of model against plain Keras on the same globally batched data."""

import numpy as np
import tnt_comm
import tnt_keras as tnt
from _job import build, compile_args, dataset, flat, history_diff, max_diff, report

# (model, optimizer, rows, global batch): covers B divisible and not by 2 and 3, with and without a
# partial last batch (60/12: even; 64/12: partial 4; 70/7: not divisible; 75/7: both).
SCENARIOS = [
    ("functional", "sgd", 60, 12),
    ("sequential", "adam", 75, 7),
    ("subclassed", "rmsprop", 64, 12),
    ("custom_step", "adagrad", 70, 7),
    ("functional", "adamw", 75, 7),
    ("subclassed", "adam", 70, 7),
    ("sequential", "sgd", 64, 12),
    # Embedding tables get sparse gradients, which Keras' optimizers apply to the named rows only.
    ("embedding", "adam", 75, 7),
    ("embedding", "rmsprop", 64, 12),
]

results = {}
for kind, opt, rows, batch in SCENARIOS:
    name = f"{kind}-{opt}-{rows}-{batch}"
    # A seeded reshuffling dataset advances its order with every pass, so each run gets its own.
    serial = build(kind)
    serial.compile(**compile_args(opt))
    serial_history = serial.fit(dataset(rows, batch, seed=rows), epochs=3, verbose=0).history

    model = tnt.Model(build(kind))
    model.compile(**compile_args(opt))
    history = model.fit(dataset(rows, batch, seed=rows), epochs=3, verbose=0).history
    assert isinstance(model, tnt.Model)

    plain = dataset(rows, batch, seed=rows, shuffle=False)
    serial_eval = serial.evaluate(plain, verbose=0, return_dict=True)
    tnt_eval = model.evaluate(plain, verbose=0, return_dict=True)
    results[name] = {
        "weights_err": max_diff(serial.get_weights(), model.get_weights()),
        "history_err": history_diff(serial_history, history),
        "epochs": len(history["loss"]),
        "weights": flat(model.get_weights()),
        "eval_err": max(abs(serial_eval[k] - tnt_eval[k]) for k in serial_eval),
        "predict_err": float(np.max(np.abs(serial.predict(plain, verbose=0) - model.predict(plain, verbose=0)))),
        "predict_rows": int(model.predict(plain, verbose=0).shape[0]),
    }
report({"rank": tnt.get_rank(), "size": tnt.get_size(), "scenarios": results, "transports": tnt_comm.transports()})
