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
