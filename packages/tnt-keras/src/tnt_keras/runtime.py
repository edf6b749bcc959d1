"""The rank API, the output policy and the ``tnt_keras`` logger.

Ranks come from the tnt_comm runtime, which reads the environment contract that ``tnt-launch`` sets.
Without it a process is a single rank, so ``python train.py`` keeps working.
"""

from __future__ import annotations

import logging
import os

import tnt_comm
from tnt_comm import contract

MASTER_RANK = 0

logger = logging.getLogger("tnt_keras")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def get_rank() -> int:
    """This process's rank, 0 to ``get_size() - 1``."""
    return tnt_comm.rank()


def get_size() -> int:
    """The number of ranks in the job."""
    return tnt_comm.size()


def membership() -> tuple[int, list[int]]:
    """``(generation, members)`` of the job: the generation is 0 until an elastic job (tnt-launch
    --elastic) first re-forms, then counts each change (ranks lost, replacements joined);
    ``members[r]`` is the id of rank r for life (its rank when the job started; a replacement's is
    new). A script can see with it what happened to its job."""
    return tnt_comm.membership()


def get_local_rank() -> int:
    """This process's index among the ranks on its host."""
    return tnt_comm.local_rank()


def get_master_rank() -> int:
    """The rank that prints and writes files by default: always 0."""
    return MASTER_RANK


def is_master_rank() -> bool:
    return get_rank() == MASTER_RANK


def output_on_all_devices() -> bool:
    """Whether every rank prints progress bars and callback messages (``--output-on-all-devices``)."""
    return _env_flag(contract.OUTPUT_ON_ALL_DEVICES)


def tensorboard_on_all_devices() -> bool:
    """Whether every rank writes TensorBoard logs (``TNT_TENSORBOARD_ON_ALL_DEVICES``)."""
    return _env_flag(contract.TENSORBOARD_ON_ALL_DEVICES)


def prints_here() -> bool:
    """Whether this rank shows output: the master rank, or all ranks when asked for."""
    return is_master_rank() or output_on_all_devices()


def live_progress() -> bool:
    """Whether ``verbose="auto"`` may draw Keras' live progress bar on this rank.

    No when ``tnt-launch`` says this rank's stdout reaches no terminal as it is written
    (``TNT_STDOUT_TTY=false``: a pipe, a file, or lines prefixed by ``--output-on-all-devices``);
    without it (no tnt-launch), yes, as in plain Keras.
    """
    if not os.environ.get(contract.STDOUT_TTY, "").strip():
        return True
    return _env_flag(contract.STDOUT_TTY)


def fusion_threshold_bytes() -> int:
    """Smallest gradient bucket (``--fusion-threshold``/``TNT_FUSION_THRESHOLD_KB``, default 32 KiB)."""
    raw = os.environ.get(contract.FUSION_THRESHOLD_KB, "32")
    try:
        kib = int(raw)
    except ValueError:
        raise ValueError(f"{contract.FUSION_THRESHOLD_KB} must be a whole number of KiB, got {raw!r}") from None
    if kib < 0:
        raise ValueError(f"{contract.FUSION_THRESHOLD_KB} must be >= 0, got {kib}")
    return kib * 1024


def _rank_for_logs() -> int:
    """This process's rank without starting the runtime: get_rank() would connect to every peer
    first, and a log line written while a peer is busy (compiling the op under a file lock that
    this process waits for next) would then wait for that peer, which waits for us: a deadlock.
    Once the runtime runs, its rank: an elastic job that re-formed numbers its ranks anew."""
    if tnt_comm.is_initialized():
        return tnt_comm.rank()
    return contract.rank_from_environment()


class _RankFilter(logging.Filter):
    """Prefixes records with the rank; drops them off the master rank unless all ranks log."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = _rank_for_logs()
        record.tnt_rank = rank
        return rank == MASTER_RANK or _env_flag(contract.LOG_ON_ALL_DEVICES)


_HANDLER = "tnt_keras"  # the name of the handler setup_logging adds, once


def setup_logging() -> None:
    """Configures the ``tnt_keras`` logger once, from ``TNT_LOG_LEVEL`` (default WARNING)."""
    if any(handler.get_name() == _HANDLER for handler in logger.handlers):
        return
    level = os.environ.get(contract.LOG_LEVEL, "WARNING").upper()
    logger.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "WARNING")
    handler = logging.StreamHandler()
    handler.set_name(_HANDLER)
    handler.setFormatter(logging.Formatter("[tnt %(levelname)s rank %(tnt_rank)s] %(message)s"))
    handler.addFilter(_RankFilter())
    logger.addHandler(handler)
    logger.propagate = False
