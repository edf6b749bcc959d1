"""25M-parameter models on 2 real ranks train as serial training does (issue 11, section 6).

The models of test_training.py have a few hundred parameters; these two have 23-24M, so every step
sums about 94 MB of gradients in many fused buckets while backprop goes on. ``jobs/large_models_job.py``
trains each model for 3 steps of global batch 8 (4 rows per rank), SGD with momentum 0.9, float32,
starting both runs from the same initial weights, and every rank compares with a serial reference
(each model's computed once, by one rank, for every rank):

- Transformer encoder (the benchmark's: 6 blocks of width 512, 32 tokens, 23.0M parameters, a
  sparse-gradient token embedding): the reference is plain Keras ``fit`` on the same global
  batches (``run_eagerly=True``: 3 steps cost less than tracing). Compared: every trainable
  variable, and the loss Keras logs after every step.
- ResNet-50 (``keras.applications.ResNet50(weights=None)`` on 32x32x3 images, 23.6M parameters,
  53 BatchNormalization layers in training mode): under data parallelism each rank normalises over
  its own 4 rows, which serial ``fit`` on 8 rows does not, so the reference is serial training
  with the same per-slice normalisation: the gradient of each rank's slice of the global batch,
  scaled by its share of the rows and summed in rank order, applied with the same optimizer (the
  global-batch gradient whenever normalisation does not mix rows), taken in a tf.function as
  Keras' train step is (eager BatchNormalization kernels differ from the graph's by percents on 4
  rows). Compared: every trainable variable, the logged loss after every step (the rows-weighted
  mean of the slice losses), and each rank's BatchNormalization moving statistics against the
  reference that kept only that rank's slice's updates (tnt leaves them per rank, see
  docs/keras.md).

Both within 1e-5, absolute; the ranks' trainable variables must also be bitwise equal, and must
have moved from their initial values.
"""

import pytest
from launch import run

TOL = 1e-5


@pytest.mark.timeout(420)
def test_large_models_equal_serial_on_2_ranks() -> None:
    # A generous collective timeout: on a loaded 2-core host the ranks' reference runs may drift apart.
    result = run("large_models_job", 2, timeout=400, env={"TNT_TIMEOUT_S": "240"})
    for rank, data in enumerate(result.ranks):
        assert (data["rank"], data["size"]) == (rank, 2)
        for kind, params, batch_norms in (("resnet50", 23_608_202, 53), ("transformer", 23_031_818, 0)):
            s = data[kind]
            assert (s["parameters"], s["batch_norm_layers"], s["steps"]) == (params, batch_norms, 3), (kind, s)
            assert s["trainable_err"] < TOL, (rank, kind, s["trainable_err"])
            assert s["non_trainable_err"] < TOL, (rank, kind, s["non_trainable_err"])
            assert s["loss_err"] < TOL, (rank, kind, s["loss_err"], s["losses"])
            assert s["moved"] > 1e-3, (rank, kind, s["moved"])
            assert s["trainable_digest"] == result.ranks[0][kind]["trainable_digest"], (rank, kind)
