"""Hiding TensorFlow's known start-up lines from the ranks' stderr.

TensorFlow 2.21 prints a few lines at start-up whatever ``TF_CPP_MIN_LOG_LEVEL`` says (absl's
logging starts before it reads the variable): once per rank, so a job of N ranks opens with N
copies. tnt-launch drops exactly these lines, recognised whole, unless ``--log-level DEBUG`` or
the user set ``TF_CPP_MIN_LOG_LEVEL`` (``plan.Plan.hide_tf_startup``). Everything else passes as
it comes, also partial lines such as progress bars; only a partial line that could still become
one of the known lines waits for the rest of it.
"""

from __future__ import annotations

import re

# absl's prefix: severity and date (month and day, 0000 before absl is initialised), time, thread.
_ABSL = rb"[IWE]\d{4} \d\d:\d\d:[\d.]+\s+\d+ "
KNOWN_LINES = tuple(
    re.compile(pattern)
    for pattern in (
        rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
        _ABSL + rb"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU "
        rb"instructions in performance-critical operations\.",
        (rb"To enable the following instructions: [A-Za-z0-9_ ,.-]+, in other operations, rebuild TensorFlow "
        rb"with the appropriate compiler flags\."),
        _ABSL + rb"port\.cc:\d+\] oneDNN custom operations are on\. You may see slightly different numerical "
        rb"results due to floating-point round-off errors from different computation orders\. To turn them "
        rb"off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`\.",
    )
)
# How each known line begins: a partial line that starts like one is held back until it ends.
_BEGINNINGS = (b"WARNING: All log messages", b"To enable the following", b"I0", b"I1", b"W0", b"W1", b"E0", b"E1")
_LONGEST = 512


def is_known(line: bytes) -> bool:
    """Whether ``line`` (without its newline, with or without a trailing carriage return) is one of
    TensorFlow's known start-up lines."""
    text = line.rstrip(b"\r")
    return any(p.fullmatch(text) for p in KNOWN_LINES)


class StartupFilter:
    """Feeds a rank's stderr through; drops the known start-up lines."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, data: bytes) -> bytes:
        data = self._held + data
        self._held = b""
        out = bytearray()
        while data:
            end = data.find(b"\n")
            if end < 0:
                # A partial line: held back only while it could still be a known line.
                if len(data) <= _LONGEST and _could_be_known(data):
                    self._held = data
                else:
                    out += data
                break
            line, data = data[: end + 1], data[end + 1 :]
            if not is_known(line[:-1]):
                out += line
        return bytes(out)

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _could_be_known(partial: bytes) -> bool:
    return any(partial.startswith(b) or b.startswith(partial) for b in _BEGINNINGS)
