"""A ProgbarLogger passed to fit takes the place of Keras' default one, as in plain Keras; a History
passed to fit is the one fit returns."""

import _quick_start  # noqa: F401, I001  (first: the collector waits out the imports)
import keras
import tnt_keras as tnt
from _job import build, compile_args, dataset, report

if tnt.is_master_rank():  # plain Keras, for comparison
    print("== plain ==", flush=True)
    plain = build("functional")
    plain.compile(**compile_args("sgd"))
    plain.fit(dataset(48, 12), epochs=2, verbose=2, callbacks=[keras.callbacks.ProgbarLogger()])
    print("== tnt ==", flush=True)

model = tnt.Model(build("functional"))
model.compile(**compile_args("sgd"))
history = keras.callbacks.History()
returned = model.fit(dataset(48, 12), epochs=3, verbose=2, callbacks=[keras.callbacks.ProgbarLogger(), history])
model_history = model.history is history  # as in Keras, until the next fit
if tnt.is_master_rank():
    print("== wrapped ==", flush=True)
# An explicitly wrapped one is still the only progress bar.
model.fit(dataset(48, 12), epochs=2, verbose=2, callbacks=[tnt.callbacks.Callback(keras.callbacks.ProgbarLogger())])
if tnt.is_master_rank():
    print("== end ==", flush=True)
report(
    {
        "history_returned": returned is history,
        "history_epochs": history.epoch,
        "model_history": model_history,
    }
)
