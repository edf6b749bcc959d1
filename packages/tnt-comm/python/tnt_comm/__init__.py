"""tnt_comm: collectives for distributed training.

Ranks are processes started by ``tnt-launch`` (or by anything that sets the TNT_* environment
contract); without that environment a process is a single rank, so scripts still run alone.

    import numpy as np
    import tnt_comm

    x = np.full(4, tnt_comm.rank(), dtype=np.float32)
    total = tnt_comm.allreduce(x)            # blocking
    work = tnt_comm.iallreduce(x, op="max")  # non-blocking
    print(work.wait())

Every collective takes numpy arrays or any C-contiguous buffer-protocol object (zero-copy) and an
optional ``group`` (see ``new_group``); non-blocking forms are prefixed ``i`` and return ``Work``.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _core, _trace, contract
from ._buffers import OP_CODES, as_array, dtype_code, op_code
from ._errors import error_data, error_from_data, install_exit_hook

__all__ = [
    "CollectiveMismatch",
    "FusedAllreduce",
    "Group",
    "PeerFailure",
    "Timeout",
    "TntError",
    "Work",
    "allgather",
    "allgatherv",
    "admit",
    "allreduce",
    "barrier",
    "broadcast",
    "build_info",
    "cmake_prefix_path",
    "error_data",
    "error_from_data",
    "finalize",
    "get_include",
    "iallgather",
    "iallreduce",
    "ibarrier",
    "ibroadcast",
    "init",
    "irecv",
    "is_initialized",
    "ireduce_scatter",
    "isend",
    "local_rank",
    "local_size",
    "membership",
    "new_group",
    "plan_buckets",
    "rank",
    "recv",
    "reduce_scatter",
    "send",
    "shared_empty",
    "shrink",
    "size",
    "timeline_events",
    "timeline_now_ns",
    "timeline_start",
    "timeline_stop",
    "timeline_write",
    "transports",
    "world",
]

__version__ = "0.1.0"

TntError = _core.TntError
CollectiveMismatch = _core.CollectiveMismatch
PeerFailure = _core.PeerFailure
Timeout = _core.Timeout

# What an error is about, as data: tnt-comm sets these on every error it raises; the class values
# are what an error made in Python (``PeerFailure("...")``) has until its maker sets them.
#   ranks      the world ranks to blame: dead, stalled or disagreeing; empty if none is known
#   operation  the call that stopped ("allreduce", "broadcast", "send/recv", ...), or None
#   group      that call's group id (Group.id), or None
#   call       that call's number on its group, from 0, or None
#   mine, theirs  for a mismatch: this rank's call and the blamed rank's, described; else None
#   peer_error the error a failed peer said it left with ("ValueError: ..."), or None
for _type in (TntError, _core.InvalidArgument):
    _type.ranks = ()
    _type.operation = _type.group = _type.call = _type.mine = _type.theirs = _type.peer_error = None
PeerFailure.rank = None  # the first of ``ranks``, kept for older callers

install_exit_hook()  # a rank reports the error it ends with (to tnt-launch), then tells its peers

_finalizer_registered = False


def init() -> None:
    """Starts the runtime from the environment (idempotent; collectives call it implicitly)."""
    global _finalizer_registered
    if not _core.is_initialized():
        _core.init()
    if not _finalizer_registered:
        atexit.register(finalize)
        _finalizer_registered = True


def is_initialized() -> bool:
    """Whether the runtime runs in this process (started, and not finalized): ``rank()`` then
    answers without connecting to anyone."""
    return bool(_core.is_initialized())


def finalize() -> None:
    """Waits for outstanding work and for every peer to have read what this rank sent it (or to
    have left; at most the collective timeout), then disconnects from every peer."""
    _inflight.clear()
    _core.finalize()


_identity_cache: dict[str, Any] = {}


def shrink() -> Group:
    """Re-forms an elastic job (``tnt-launch --elastic MIN``) after it lost a rank, and returns the new
    world. Every survivor calls it once a collective has raised ``PeerFailure`` or ``Timeout``: they
    agree on who is left at the store the launcher holds, and meet again as ranks 0..K-1, in the
    order of their old ranks. Groups, ``Work`` handles and ``FusedAllreduce`` objects of the old job
    raise ``TntError`` afterwards; make new ones. Raises ``TntError`` on a rank the others took for
    lost (it must leave) or after a failure that re-forming would not cure (a mismatch),
    ``PeerFailure`` where fewer than MIN ranks are left, and ``ValueError`` (``InvalidArgument``)
    where the job is not elastic or nothing failed."""
    global _world
    init()
    _inflight.clear()
    _world = None
    _identity_cache.clear()
    _core.shrink()
    return world()


def admit() -> bool:
    """Admits into an elastic job the replacement processes that asked to join (tnt-launch starts
    them, with ``TNT_JOIN``), after the current ranks, and returns whether the world changed (then,
    as after ``shrink``, the old world's groups and handles raise; make new ones). Collective: every
    rank calls it at the same point of its program (tnt-keras: each epoch's start). Costs one
    broadcast of a number where nobody asked; returns False at once where the job is not elastic.
    A replacement's own first call of tnt_comm waits until it is admitted."""
    global _world
    init()
    if not _core.admit():
        return False
    _inflight.clear()
    _world = None
    _identity_cache.clear()
    return True


def membership() -> tuple[int, list[int]]:
    """``(generation, members)`` of the job: the generation is 0 until the first ``shrink``;
    ``members[r]`` is the id of world rank r, its rank in generation 0, kept for life."""
    init()
    generation, members = _core.membership()
    return int(generation), [int(m) for m in members]


def _identity() -> dict[str, Any]:
    # Kept after finalize(), so code that runs late (logging at exit) still knows its rank.
    if not _identity_cache:
        init()
        _identity_cache.update(_core.identity())
    return _identity_cache


def rank() -> int:
    return int(_identity()["rank"])


def size() -> int:
    return int(_identity()["size"])


def local_rank() -> int:
    return int(_identity()["local_rank"])


def local_size() -> int:
    return int(_identity()["local_size"])


def transports() -> list[str]:
    """How this rank reaches each world rank: 'self', 'shm' or 'tcp'."""
    init()
    return list(_core.transports())


def timeline_start(path: str | os.PathLike[str] | None = None) -> None:
    """Record every operation from now on: when it was submitted, taken in by the engine (behind
    the operations before it) and completed, with its bytes; and every wait of a caller blocked on a
    non-blocking operation (name "wait"). Times are of the steady clock, as ``time.monotonic_ns()``.
    ``path`` is where ``timeline_write`` puts the trace (TNT_TIMELINE, which ``tnt-launch --timeline
    FILE`` sets, starts the timeline at import, with that path)."""
    _trace.start(path)


def timeline_events() -> list[dict[str, Any]]:
    """The events recorded since the last call (oldest first), as dicts of their fields (name, group,
    call, bytes, submitted_ns, started_ns, ended_ns, blocking, failed, algorithm, phases). Events
    taken here are not in the trace ``timeline_write`` writes."""
    return _trace.events()


def timeline_stop() -> list[dict[str, Any]]:
    """Stop recording; the events not taken yet."""
    return _trace.stop()


def timeline_write() -> None:
    """Collective (call it on every rank): rank 0 writes the job's trace, every rank's collectives
    since the timeline started, to the path of ``timeline_start`` or TNT_TIMELINE (``tnt-launch
    --timeline FILE``), in Chrome's trace-event JSON (Perfetto opens it). Raises OSError on rank 0
    where the file cannot be written; does nothing where the timeline is off. tnt-keras writes the
    trace itself (at the end of ``fit``, ...): only a script of tnt-comm alone needs this."""
    _trace.write(rank(), size())


def timeline_now_ns() -> int:
    """The clock of the timeline's events, in nanoseconds."""
    return int(_core.timeline_now_ns())


def _rank_without_starting() -> int:
    """This rank, from the runtime where it ran, else from the environment: never starts it."""
    if _identity_cache:
        return int(_identity_cache["rank"])
    return contract.rank_from_environment()


_trace.start_from_environment()  # TNT_TIMELINE=FILE: record from the start
atexit.register(_trace.say_if_unwritten, _rank_without_starting)


def build_info() -> dict[str, Any]:
    """What this installation of tnt-comm has, without starting a job: its version and folder, the
    transports compiled in, GPI-2 (None: not built with it) and the compiler."""
    info: dict[str, Any] = dict(_core.build_info())
    info["version"] = __version__
    info["path"] = str(Path(__file__).resolve().parent)
    return info


def get_include() -> str:
    """Directory of the installed C++ headers."""
    return str(Path(__file__).parent / "include")


def cmake_prefix_path() -> str:
    """Put this on CMAKE_PREFIX_PATH to ``find_package(tnt_comm)`` from C++ projects."""
    return str(Path(__file__).parent)


# Buffers of in-flight operations stay referenced here until their Work is seen complete, so a
# dropped Work handle can never leave the engine writing into freed memory.
_inflight: set[Work] = set()


def _prune() -> None:
    for w in [w for w in _inflight if w._native.is_completed()]:
        _inflight.discard(w)


class Work:
    """Handle of a non-blocking collective; ``wait()`` returns its result."""

    def __init__(self, native: Any, result: Any, keep: tuple[Any, ...] = ()) -> None:
        self._native = native
        self._result = result
        self._keep = keep  # buffers the engine still uses
        _prune()
        _inflight.add(self)

    def wait(self, timeout: float | None = None) -> Any:
        """Blocks until done and returns the result; raises Timeout if `timeout` seconds pass."""
        if not self._native.wait(timeout):
            raise Timeout(f"the operation did not complete within {timeout} s (it keeps running)")
        _inflight.discard(self)
        return self._result

    def is_completed(self) -> bool:
        return bool(self._native.is_completed())


def _op(op: str) -> int:
    try:
        return OP_CODES[op]
    except (KeyError, TypeError):
        return op_code(str(op))


class Group:
    """A set of world ranks that run collectives together. Every member must create it."""

    def __init__(self, native: Any, is_world: bool = False) -> None:
        self._native = native
        self._g = None if is_world else native  # the native core treats None as the world

    @property
    def rank(self) -> int:
        """This process's index in the group (-1 if it is not a member)."""
        return int(self._native.rank)

    @property
    def size(self) -> int:
        return int(self._native.size)

    @property
    def id(self) -> int:
        """The group's id: the same on every member, and what errors name as their ``group``."""
        return self._native.id

    @property
    def ranks(self) -> list[int]:
        return list(self._native.ranks)

    def __repr__(self) -> str:
        return f"Group(ranks={self.ranks}, rank={self.rank})"

    def allreduce(self, x: Any, op: str = "sum", out: Any = None) -> np.ndarray:
        """Reduces `x` elementwise across ranks (sum, prod, min, max or avg); same result on all."""
        x = as_array(x)
        o = np.empty_like(x, order="C") if out is None else as_array(out, "out")
        _core.allreduce(self._g, x, o, _op(op), True)
        return o if out is None else out

    def iallreduce(self, x: Any, op: str = "sum", out: Any = None) -> Work:
        x = as_array(x)
        o = np.empty_like(x, order="C") if out is None else as_array(out, "out")
        return Work(_core.allreduce(self._g, x, o, _op(op), False), o if out is None else out, (x, o))

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrites `x` on every rank with the root's `x`, in place, and returns it."""
        _core.broadcast(self._g, as_array(x), int(root), True)
        return x

    def ibroadcast(self, x: Any, root: int = 0) -> Work:
        a = as_array(x)
        return Work(_core.broadcast(self._g, a, int(root), False), x, (a,))

    def allgather(self, x: Any, out: Any = None) -> np.ndarray:
        """Returns an array of shape (group size, *x.shape): every rank's `x` in rank order."""
        x = as_array(x)
        o = np.empty((self.size, *x.shape), dtype=x.dtype) if out is None else as_array(out, "out")
        _core.allgather(self._g, x, o, True)
        return o if out is None else out

    def iallgather(self, x: Any, out: Any = None) -> Work:
        x = as_array(x)
        o = np.empty((self.size, *x.shape), dtype=x.dtype) if out is None else as_array(out, "out")
        return Work(_core.allgather(self._g, x, o, False), o if out is None else out, (x, o))

    def allgatherv(self, x: Any) -> np.ndarray:
        """Concatenates every rank's `x` along axis 0; the first dimension may differ per rank."""
        a = as_array(x)
        if a.ndim == 0:
            a = a.reshape(1)
        if a.ndim > 8:
            raise ValueError("allgatherv supports at most 8 dimensions")
        meta = np.array([a.shape[0], a.ndim, *a.shape[1:]] + [0] * (8 - a.ndim), dtype=np.int64)
        metas = self.allgather(meta)
        for r, m in enumerate(metas):
            if not np.array_equal(m[1:], meta[1:]):
                theirs = tuple(int(d) for d in m[2 : 1 + int(m[1])])
                raise ValueError(
                    f"allgatherv: rank {self.ranks[r]} passed trailing shape {theirs} but rank "
                    f"{self.ranks[self.rank]} passed {tuple(a.shape[1:])}; only the first dimension "
                    f"may differ"
                )
        row = int(np.prod(a.shape[1:], dtype=np.int64))
        counts = [int(m[0]) * row for m in metas]
        o = np.empty((int(metas[:, 0].sum()), *a.shape[1:]), dtype=a.dtype)
        _core.allgatherv(self._g, np.ascontiguousarray(a), o, counts)
        return o

    def reduce_scatter(self, x: Any, op: str = "sum") -> np.ndarray:
        """Reduces `x` across ranks and returns this rank's block of axis 0 (len(x) // size rows)."""
        return self._reduce_scatter(x, op, True)

    def ireduce_scatter(self, x: Any, op: str = "sum") -> Work:
        return self._reduce_scatter(x, op, False)

    def _reduce_scatter(self, x: Any, op: str, blocking: bool) -> Any:
        a = as_array(x)
        n = self.size
        if a.ndim == 0 or a.shape[0] % n != 0:
            first = a.shape[0] if a.ndim else "a scalar"
            raise ValueError(
                f"reduce_scatter: the first dimension of x ({first}) must be a multiple of the group size {n}"
            )
        o = np.empty((a.shape[0] // n, *a.shape[1:]), dtype=a.dtype)
        native = _core.reduce_scatter(self._g, a, o, _op(op), blocking)
        return o if blocking else Work(native, o, (a, o))

    def barrier(self) -> None:
        _core.barrier(self._g, True)

    def ibarrier(self) -> Work:
        return Work(_core.barrier(self._g, False), None)

    def send(self, x: Any, dst: int) -> None:
        """Sends `x` to group rank `dst`, which must post a matching recv (same dtype and size)."""
        _core.send(self._g, as_array(x), int(dst), True)

    def isend(self, x: Any, dst: int) -> Work:
        a = as_array(x)
        return Work(_core.send(self._g, a, int(dst), False), None, (a,))

    def recv(self, out: Any, src: int) -> Any:
        """Receives into `out` from group rank `src` and returns `out`."""
        _core.recv(self._g, as_array(out, "out"), int(src), True)
        return out

    def irecv(self, out: Any, src: int) -> Work:
        o = as_array(out, "out")
        return Work(_core.recv(self._g, o, int(src), False), out, (o,))


def shared_empty(shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised array in this rank's shared arena, which the other ranks of its host map:
    large allreduces of such arrays (input and output) skip the copy that stages other buffers
    (docs/comm.md, "The single-copy path"). Where the rank has no arena (alone on its host,
    ``TNT_SINGLE_COPY=off``, under 1 GiB free in /dev/shm), an ordinary ``numpy.empty``. The memory
    returns to the arena when the array and every view of it are gone."""
    dt = np.dtype(dtype)
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shared_empty: negative dimension in shape {dims}")
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    block = _core.allocate_shared(nbytes)
    if block is None:
        return np.empty(dims, dt)
    return np.frombuffer(block, dtype=np.uint8, count=nbytes).view(dt).reshape(dims)


def plan_buckets(counts: Sequence[int], dtypes: Sequence[Any], threshold_bytes: int) -> list[list[int]]:
    """The fusion plan: the indices of tensors of ``counts`` elements of ``dtypes``, grouped in the
    order given into buckets of one dtype and at least ``threshold_bytes`` each (the last may be
    smaller; 0: one tensor per bucket). ``FusedAllreduce`` and tnt-keras' gradient sum both fuse by it."""
    if len(counts) != len(dtypes):
        raise ValueError(f"plan_buckets: {len(counts)} counts but {len(dtypes)} dtypes")
    codes = [dtype_code(dt, f"tensor {i}") for i, dt in enumerate(dtypes)]
    return [list(b) for b in _core.plan_buckets([int(c) for c in counts], codes, int(threshold_bytes))]


class FusedAllreduce:
    """Allreduce of a fixed list of tensors through fusion buckets, reusable step after step.

    Tensors are grouped in the order given into buckets of at least `threshold_bytes` (0: one
    tensor per bucket). ``start(i, x)`` hands tensor i over; a bucket starts once all its tensors
    and every earlier bucket have started; ``wait(i)`` returns tensor i's reduced values.
    """

    def __init__(
        self,
        tensors: Sequence[tuple[Sequence[int], Any]],
        threshold_bytes: int = 0,
        op: str = "sum",
        group: Group | None = None,
    ) -> None:
        g = group or world()
        self._shapes = [tuple(int(d) for d in shape) for shape, _ in tensors]
        self._dtypes = [np.dtype(dt) for _, dt in tensors]
        # Counted once: start and wait run once per tensor and step, often inside a backward pass,
        # where numpy's prod took 35-45 us a call on a busy core (cold caches between the kernels).
        self._counts = [int(np.prod(s, dtype=np.int64)) for s in self._shapes]
        codes = [dtype_code(dt, f"tensor {i}") for i, dt in enumerate(self._dtypes)]
        if threshold_bytes < 0:
            raise ValueError("threshold_bytes must be >= 0")
        self._native = _core.FusedAllreduce(g._g, self._counts, codes, int(threshold_bytes), op_code(op))

    @property
    def buckets(self) -> list[list[int]]:
        """Tensor indices of each bucket, in start order."""
        return [list(b) for b in self._native.buckets]

    def start(self, i: int, x: Any, scale: float | None = None) -> None:
        """Hands tensor i over, times ``scale`` if given (floating dtypes: the scale and each product
        rounded to the dtype; a scale of 0 gives zeros even for NaN), copied into its bucket at once."""
        a = as_array(x, f"tensor {i}")
        if a.size != self._counts[i] or a.dtype != self._dtypes[i]:
            raise ValueError(
                f"tensor {i} has shape {a.shape} and dtype {a.dtype.name}, but "
                f"{self._shapes[i]} and {self._dtypes[i].name} were declared"
            )
        self._native.start(i, a, None if scale is None else float(scale))

    def wait(self, i: int, out: Any = None) -> np.ndarray:
        o = np.empty(self._shapes[i], self._dtypes[i]) if out is None else as_array(out, "out")
        if o.size != self._counts[i] or o.dtype != self._dtypes[i]:
            raise ValueError(f"out must have shape {self._shapes[i]} and dtype {self._dtypes[i].name}")
        self._native.wait(i, o)
        return o if out is None else out

    def is_ready(self, i: int) -> bool:
        return bool(self._native.is_ready(i))


_world: Group | None = None


def world() -> Group:
    """The group of all ranks."""
    global _world
    if _world is None:
        init()
        _world = Group(_core.world(), is_world=True)
    return _world


def new_group(ranks: Sequence[int]) -> Group:
    """A group of the given world ranks, in that order; every listed rank must call this too."""
    init()
    return Group(_core.new_group([int(r) for r in ranks]))


def _on(group: Group | None) -> Group:
    return group if group is not None else world()


def allreduce(x: Any, op: str = "sum", out: Any = None, group: Group | None = None) -> np.ndarray:
    """Reduces `x` elementwise across ranks (sum, prod, min, max or avg); same result on all."""
    if group is None and type(x) is np.ndarray and type(out) is np.ndarray and _world is not None:
        _core.allreduce(None, x, out, _op(op), True)  # the common case, kept short: small calls are µs
        return out
    return _on(group).allreduce(x, op, out)


def iallreduce(x: Any, op: str = "sum", out: Any = None, group: Group | None = None) -> Work:
    return _on(group).iallreduce(x, op, out)


def broadcast(x: Any, root: int = 0, group: Group | None = None) -> np.ndarray:
    return _on(group).broadcast(x, root)


def ibroadcast(x: Any, root: int = 0, group: Group | None = None) -> Work:
    return _on(group).ibroadcast(x, root)


def allgather(x: Any, out: Any = None, group: Group | None = None) -> np.ndarray:
    return _on(group).allgather(x, out)


def iallgather(x: Any, out: Any = None, group: Group | None = None) -> Work:
    return _on(group).iallgather(x, out)


def allgatherv(x: Any, group: Group | None = None) -> np.ndarray:
    return _on(group).allgatherv(x)


def reduce_scatter(x: Any, op: str = "sum", group: Group | None = None) -> np.ndarray:
    return _on(group).reduce_scatter(x, op)


def ireduce_scatter(x: Any, op: str = "sum", group: Group | None = None) -> Work:
    return _on(group).ireduce_scatter(x, op)


def barrier(group: Group | None = None) -> None:
    _on(group).barrier()


def ibarrier(group: Group | None = None) -> Work:
    return _on(group).ibarrier()


def send(x: Any, dst: int, group: Group | None = None) -> None:
    _on(group).send(x, dst)


def isend(x: Any, dst: int, group: Group | None = None) -> Work:
    return _on(group).isend(x, dst)


def recv(out: Any, src: int, group: Group | None = None) -> Any:
    return _on(group).recv(out, src)


def irecv(out: Any, src: int, group: Group | None = None) -> Work:
    return _on(group).irecv(out, src)
