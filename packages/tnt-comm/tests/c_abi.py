"""tnt-comm's C ABI (include/tnt_comm/c_api.h, version 3) through ctypes, as a native extension
sees it: the table from the capsule, and errors as data."""

from __future__ import annotations

import ctypes
from typing import Any

import tnt_comm

# enum tnt_comm_error_kind
KINDS = {1: "TntError", 2: "CollectiveMismatch", 3: "PeerFailure", 4: "Timeout", 5: "InvalidArgument", 6: "other"}


class Error(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("message", ctypes.c_char_p),
        ("ranks", ctypes.POINTER(ctypes.c_int32)),
        ("num_ranks", ctypes.c_uint32),
        ("operation", ctypes.c_char_p),
        ("group", ctypes.c_uint64),
        ("call", ctypes.c_int64),
        ("mine", ctypes.c_char_p),
        ("theirs", ctypes.c_char_p),
        ("peer_error", ctypes.c_char_p),
    ]

    def data(self) -> dict[str, Any]:
        """A copy that outlives the callback (the strings are valid only during it)."""
        return {
            "kind": KINDS.get(self.kind, self.kind),
            "message": self.message.decode(),
            "ranks": [self.ranks[i] for i in range(self.num_ranks)],
            "operation": self.operation.decode(),
            "group": self.group,
            "call": self.call,
            "mine": self.mine.decode(),
            "theirs": self.theirs.decode(),
            "peer_error": self.peer_error.decode(),
        }


DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Error))


class Api(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("rank", ctypes.CFUNCTYPE(ctypes.c_int)),
        ("size", ctypes.CFUNCTYPE(ctypes.c_int)),
        (
            "allreduce_async",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_uint64,
                ctypes.c_int32,
                ctypes.c_int32,
                DONE,
                ctypes.c_void_p,
            ),
        ),
        (
            "broadcast_async",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_void_p,
                ctypes.c_uint64,
                ctypes.c_int32,
                ctypes.c_int32,
                DONE,
                ctypes.c_void_p,
            ),
        ),
        ("last_error", ctypes.CFUNCTYPE(ctypes.POINTER(Error))),
        ("alloc_shared", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p))),
        ("free_shared", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
        (
            "fused_layout",
            ctypes.CFUNCTYPE(
                ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int32,
                ctypes.POINTER(ctypes.c_uint64),
            ),
        ),
        (
            "fused_allreduce_async",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_uint32,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_uint64),
                ctypes.c_void_p,
                ctypes.c_int32,
                ctypes.c_int32,
                ctypes.POINTER(ctypes.c_float),
                DONE,
                ctypes.c_void_p,
            ),
        ),
    ]


def table() -> Api:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return Api.from_address(get(tnt_comm._core._C_API, b"tnt_comm._C_API"))


def recorder() -> tuple[list[dict[str, Any] | None], Any]:
    """A completion callback that appends None (success) or the error's data to a list."""
    results: list[dict[str, Any] | None] = []

    def done(ctx: Any, error: Any) -> None:
        results.append(error.contents.data() if error else None)

    return results, DONE(done)
