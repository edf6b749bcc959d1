"""Turning user buffers into (address, count, dtype code) for the native core, with clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np

# Codes of tnt::DType (include/tnt_comm/types.hpp).
DTYPE_CODES: dict[str, int] = {
    "float16": 0,
    "bfloat16": 1,  # ml_dtypes.bfloat16
    "float32": 2,
    "float64": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
}
OP_CODES: dict[str, int] = {"sum": 0, "prod": 1, "min": 2, "max": 3, "avg": 4}


def as_array(x: Any, name: str = "x") -> np.ndarray:
    """Views `x` (a numpy array or any buffer-protocol object) as a numpy array without copying.

    Contiguity, writability and dtype are checked by the native core, which names the problem.
    """
    if isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        raise TypeError(
            f"{name} must be a numpy array or support the buffer protocol, got {type(x).__name__}"
        ) from None


def dtype_code(dtype: Any, name: str = "x") -> int:
    dt = np.dtype(dtype)
    if not dt.isnative:
        raise TypeError(
            f"{name} has dtype {dt.str}, whose byte order is not this machine's; convert it with "
            f".astype({dt.name!r}) (tnt_comm reduces values in native byte order only)"
        )
    code = DTYPE_CODES.get(dt.name)
    if code is None:
        supported = ", ".join(DTYPE_CODES)
        raise TypeError(
            f"{name} has dtype {np.dtype(dtype).name}, which tnt_comm does not support; "
            f"use one of {supported} (convert with .astype(...))"
        )
    return code


def op_code(op: str) -> int:
    code = OP_CODES.get(op)
    if code is None:
        raise ValueError(f"unknown reduction op {op!r}; use one of {', '.join(OP_CODES)}")
    return code
