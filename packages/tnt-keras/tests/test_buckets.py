"""The gradient bucket plan and the fusion threshold setting (one process, no ranks needed)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

# TensorFlow comes with the `tf` fixture, and tnt_keras (which imports it) inside the tests: not at
# collection (conftest.py).


def grads(tf: ModuleType, *specs: tuple[int, str]) -> list[Any]:
    return [tf.zeros([n], dtype) for n, dtype in specs]


F32, F16 = "float32", "float16"


def test_buckets_start_from_the_last_gradient_and_reach_the_threshold(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import gradients as reduce

    g = grads(tf, (10, F32), (100, F32), (5, F32), (20, F32))  # 40, 400, 20, 80 bytes
    assert reduce.plan_buckets(g, 100) == [[3, 2], [1], [0]]
    assert reduce.plan_buckets(g, 1 << 20) == [[3, 2, 1, 0]]


def test_threshold_zero_sends_every_gradient_alone(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import gradients as reduce

    g = grads(tf, (10, F32), (100, F32), (5, F32))
    assert reduce.plan_buckets(g, 0) == [[2], [1], [0]]


def test_buckets_never_mix_dtypes_and_skip_missing_gradients(tf: ModuleType) -> None:
    from tnt_keras.backends.tensorflow import gradients as reduce

    g: list[Any] = [*grads(tf, (10, F32), (10, F16)), None, *grads(tf, (10, F32))]
    assert reduce.plan_buckets(g, 1 << 20) == [[3], [1], [0]]


@pytest.mark.parametrize(("raw", "expected"), [(None, 32 * 1024), ("0", 0), ("64", 64 * 1024)])
def test_threshold_comes_from_the_launcher_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int
) -> None:
    if raw is None:
        monkeypatch.delenv("TNT_FUSION_THRESHOLD_KB", raising=False)
    else:
        monkeypatch.setenv("TNT_FUSION_THRESHOLD_KB", raw)
    from tnt_keras import runtime

    assert runtime.fusion_threshold_bytes() == expected


@pytest.mark.parametrize("raw", ["-1", "32k", ""])
def test_a_bad_threshold_is_named(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("TNT_FUSION_THRESHOLD_KB", raw)
    from tnt_keras import runtime

    with pytest.raises(ValueError, match="TNT_FUSION_THRESHOLD_KB"):
        runtime.fusion_threshold_bytes()


def test_packed_buckets_sum_as_the_op_does(tf: ModuleType) -> None:
    """Where the process sees a GPU, each bucket is packed into one tensor before the op (one copy to
    the host per bucket); the packing runs here on the CPU and must give the op's own results
    bitwise, NaN of an empty slice (scale 0) included. (Its placement on a GPU is untested here.)"""
    import numpy as np
    from tnt_keras.backends.tensorflow import gradients as reduce

    rng = np.random.default_rng(0)
    tensors = [tf.constant(rng.normal(size=shape).astype("float32")) for shape in ((3, 4), (5,), (2, 2, 2))]
    tensors.append(tf.constant([np.nan, 1.0], dtype="float32"))
    buckets = [[3, 2], [1, 0]]
    for scale in (None, tf.constant(0.25), tf.constant(0.0)):
        plain = reduce.sum_buckets(tensors, buckets, scale, pack=False)
        packed = reduce.sum_buckets(tensors, buckets, scale, pack=True)
        for a, b in zip(plain, packed, strict=True):
            assert a.shape == b.shape
            assert np.array_equal(a.numpy(), b.numpy(), equal_nan=True)
    zero = reduce.sum_buckets(tensors, buckets, tf.constant(0.0), pack=True)
    assert not np.isnan(zero[3].numpy()).any()
