"""One rank of the allreduce benchmark; started by allreduce.py, never by hand.

``python _worker.py LIB PLAN.json``: initialises LIB (tnt, mpi or gloo) from the environment the
driver (or mpirun) set, then for each message size of the plan checks one allreduce against the
expected sum, runs the warm-up iterations, and records a timestamp after each timed iteration. Each
finished size becomes one JSON line in ``RESULTS/LIB.r<rank>.jsonl``; the driver turns them into
per-iteration times (max over ranks) and medians.

LIB ``copy`` is the machine's bound, not a library: no communication at all, each rank copies its
own input buffer to its own output buffer (``np.copyto``), all ranks at once, timed exactly like an
allreduce of the same size. The ranks meet in barriers on a small shared file the driver created
(``BENCH_BARRIER``), one slot per rank.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Protocol

import numpy as np

# The driver looks for this in /proc/PID/cmdline before it kills a PID a worker reported.
MARKER = "_worker.py"


class Library(Protocol):
    rank: int
    size: int
    reduces: bool
    """True: the result is the sum over ranks; False (copy): the rank's own input."""

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        """Allocates the buffers for ``count`` float32 elements, filled with ``rank + 1``, and
        returns (one allreduce-sum without allocation, a view of the result)."""
        ...

    def after_check(self) -> None:
        """Called after the correctness check, before warm-up."""
        ...

    def barrier(self) -> None: ...

    def version(self) -> str: ...

    def finalize(self) -> None: ...


class TntLibrary:
    reduces = True

    def __init__(self) -> None:
        import tnt_comm

        self.tnt = tnt_comm
        tnt_comm.init()
        self.rank = int(tnt_comm.rank())
        self.size = int(tnt_comm.size())

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        x = np.full(count, self.rank + 1, dtype=np.float32)
        y = np.empty_like(x)
        allreduce = self.tnt.allreduce

        def step() -> None:
            allreduce(x, op="sum", out=y)

        return step, lambda: y

    def after_check(self) -> None:
        pass

    def barrier(self) -> None:
        self.tnt.barrier()

    def version(self) -> str:
        return f"tnt_comm {getattr(self.tnt, '__version__', '?')}"

    def finalize(self) -> None:
        self.tnt.finalize()


class TntSharedLibrary(TntLibrary):
    """tnt-comm with both buffers in the rank's shared arena (tnt_comm.shared_empty): the
    single-copy allreduce on one host."""

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        x = self.tnt.shared_empty(count, np.float32)
        x[:] = self.rank + 1
        y = self.tnt.shared_empty(count, np.float32)
        allreduce = self.tnt.allreduce

        def step() -> None:
            allreduce(x, op="sum", out=y)

        return step, lambda: y


class MpiLibrary:
    reduces = True

    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        x = np.full(count, self.rank + 1, dtype=np.float32)
        y = np.empty_like(x)
        allreduce, op = self.comm.Allreduce, self.mpi.SUM
        send, recv = [x, self.mpi.FLOAT], [y, self.mpi.FLOAT]

        def step() -> None:
            allreduce(send, recv, op)

        return step, lambda: y

    def after_check(self) -> None:
        pass

    def barrier(self) -> None:
        self.comm.Barrier()

    def version(self) -> str:
        lib = self.mpi.Get_library_version().split(",")[0].strip()
        return f"{lib}, mpi4py {sys.modules['mpi4py'].__version__}"

    def finalize(self) -> None:
        pass  # mpi4py finalizes at exit


class GlooLibrary:
    reduces = True

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if "RANK" in os.environ:
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        else:  # started by tnt-launch (cluster_allreduce.py): its contract, one port above its store
            rank, size = int(os.environ["TNT_RANK"]), int(os.environ["TNT_SIZE"])
            addr, port = os.environ["TNT_MASTER_ADDR"], str(int(os.environ["TNT_MASTER_PORT"]) + 1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=float(os.environ.get("BENCH_TIMEOUT_S", "120"))),
        )
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.tensor: object = None

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        # torch.distributed has no out-of-place allreduce: the tensor is reduced in place.
        t = self.torch.full((count,), float(self.rank + 1), dtype=self.torch.float32)
        self.tensor = t
        all_reduce = self.dist.all_reduce

        def step() -> None:
            all_reduce(t)

        return step, lambda: t.numpy()

    def after_check(self) -> None:
        # In place, repeated sums of non-zero values would overflow to inf; zeros stay zeros at the
        # same cost per element.
        self.tensor.zero_()  # type: ignore[attr-defined]

    def barrier(self) -> None:
        self.dist.barrier()

    def version(self) -> str:
        return f"torch {self.torch.__version__} gloo"

    def finalize(self) -> None:
        self.dist.destroy_process_group()


_SLOT = 64  # bytes per barrier slot: one cache line each, so that ranks never share one


class _SharedBarrier:
    """A barrier through a shared file, for processes that share no library: rank r writes the
    barrier's generation into its own slot, then waits until every slot has reached it. Each slot
    has one writer, and aligned 8-byte stores are atomic, so no lock is needed."""

    def __init__(self, path: str, rank: int, size: int) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), size * _SLOT)
        self._slots = np.frombuffer(self._map, dtype=np.int64)[:: _SLOT // 8]
        self._rank = rank
        self._generation = 0

    def wait(self) -> None:
        self._generation += 1
        self._slots[self._rank] = self._generation
        started = time.perf_counter()
        while int(self._slots.min()) < self._generation:
            # Spin while the others are about to arrive; after that, leave them the core.
            if time.perf_counter() - started < 1e-3:
                os.sched_yield()
            else:
                time.sleep(5e-5)


class CopyLibrary:
    """The bound: every rank copies its S-byte input to its S-byte output at the same time."""

    reduces = False

    def __init__(self) -> None:
        self.rank = int(os.environ["BENCH_RANK"])
        self.size = int(os.environ["BENCH_SIZE"])
        self._barrier = _SharedBarrier(os.environ["BENCH_BARRIER"], self.rank, self.size)

    def prepare(self, count: int) -> tuple[Callable[[], None], Callable[[], np.ndarray]]:
        x = np.full(count, self.rank + 1, dtype=np.float32)
        y = np.empty_like(x)
        copyto = np.copyto

        def step() -> None:
            copyto(y, x)

        return step, lambda: y

    def after_check(self) -> None:
        pass

    def barrier(self) -> None:
        self._barrier.wait()

    def version(self) -> str:
        return f"numpy {np.__version__} copyto"

    def finalize(self) -> None:
        pass


LIBRARIES: dict[str, Callable[[], Library]] = {
    "tnt": TntLibrary,
    "tnt-shared": TntSharedLibrary,
    "mpi": MpiLibrary,
    "gloo": GlooLibrary,
    "copy": CopyLibrary,
}


def measure(lib: Library, nbytes: int, iters: int, warmup: int) -> dict[str, object]:
    count = nbytes // 4
    step, result = lib.prepare(count)
    lib.barrier()
    step()
    expected = lib.size * (lib.size + 1) / 2 if lib.reduces else lib.rank + 1
    out = result()
    if out.shape != (count,) or not np.all(out == expected):
        bad = int(np.argmax(out != expected)) if out.shape == (count,) else -1
        got = out[bad] if bad >= 0 else out.shape
        return {
            "size": nbytes,
            "error": f"wrong result: element {bad} is {got}, not {expected}",
        }
    lib.after_check()
    for _ in range(warmup):
        step()
    lib.barrier()
    clock = time.perf_counter_ns
    stamps = [0] * (iters + 1)
    stamps[0] = clock()
    for i in range(1, iters + 1):
        step()
        stamps[i] = clock()
    lib.barrier()
    # perf_counter_ns is CLOCK_MONOTONIC, one clock for all processes of the host: the driver
    # also compares the ranks' first and last stamps with each other.
    return {
        "size": nbytes,
        "ns": [b - a for a, b in itertools.pairwise(stamps)],
        "start_ns": stamps[0],
        "end_ns": stamps[-1],
    }


def main(argv: list[str]) -> int:
    name, plan_path = argv[1], Path(argv[2])
    plan = json.loads(plan_path.read_text())
    if os.environ.get("BENCH_CPUS"):
        # Before the library starts any thread, so that all of them inherit it.
        os.sched_setaffinity(0, {int(c) for c in os.environ["BENCH_CPUS"].split(",")})
    results = Path(plan["results"])
    # Before init, which is where a broken library would hang.
    (results / f"{name}.{os.getpid()}.pid").write_text(str(os.getpid()))
    lib = LIBRARIES[name]()
    with (results / f"{name}.r{lib.rank}.jsonl").open("a") as out:
        out.write(json.dumps({"version": lib.version()}) + "\n")
        for item in plan["sizes"]:
            record = measure(lib, item["bytes"], item["iters"], item["warmup"])
            out.write(json.dumps(record) + "\n")
            out.flush()
    lib.barrier()
    lib.finalize()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exception:  # noqa: BLE001 - any failure: report it, then exit without teardown
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # skip library teardown that could wait on a dead peer
