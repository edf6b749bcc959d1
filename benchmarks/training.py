"""Training throughput benchmark: tnt_keras against plain Keras, MultiWorkerMirroredStrategy and torch DDP.

Trains each of three models on synthetic data (SGD, sparse categorical crossentropy): a LeNet-5-like
CNN (61.7k parameters, global batch 256), Keras' ResNet-50 on 32x32 images (23.6M parameters,
batch 16) and a Transformer encoder (23.0M parameters, 32 tokens, batch 16), on Keras' TensorFlow
backend (``--backend tensorflow``, the default) or its torch backend (``--backend torch``). Every
model runs in five configurations, each in fresh processes started by this driver one after the
other: plain Keras in one process, tnt with 1 rank and with 2 ranks (through ``tnt-launch``), a
2-process competitor (TensorFlow: tf.distribute.MultiWorkerMirroredStrategy with 2 workers; torch:
torch.nn.parallel.DistributedDataParallel over Gloo around the same Keras model, Keras' own recipe),
and the machine's ceiling for 2 ranks: two plain Keras processes, each on half of every batch, with
no communication. Prints, per model, the median throughput in global samples per second, its
spread and the step time and the check of tnt's targets, then a summary of all targets, and writes
one bar chart panel per model.

    python benchmarks/training.py [--backend tensorflow|torch] [--models lenet resnet50 transformer]
                                  [--quick] [--passes P] [--rounds R] [--steps M]
                                  [--configs keras tnt1 tnt2 mwms|ddp ceiling]
                                  [--out docs/training.png] [--json docs/training.json]

See benchmarks/README.md for how the timing is done.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import _ranks
import _training_worker as worker
from tnt_comm import contract

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_training_worker.py"
TNT_KERAS_SRC = REPO / "packages" / "tnt-keras" / "src"

BACKENDS = ("tensorflow", "torch", "jax")
# Thread settings are part of each configuration (see thread_env); inherited ones would blur them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
# torch.distributed's env:// rendezvous, set by the driver for the DDP processes only.
TORCH_DIST_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# The launcher's contract: a leftover from the calling shell must not turn a worker into a rank.
CONTRACT_VARIABLES = contract.IDENTITY

# The ratios tnt is measured by, each a row of a model's targets table: tnt 2 ranks' samples/s over a
# baseline's, or (overhead) tnt 1 rank's step time over plain Keras', in percent.
RATIOS = {
    "keras": "tnt 2 ranks / plain Keras 1 process",
    "mwms": "tnt 2 ranks / MWMS 2 workers",
    "ddp": "tnt 2 ranks / torch DDP-gloo 2 procs",
    "dp": "tnt 2 ranks / Keras DataParallel 2 procs",
    "ceiling": "tnt 2 ranks / ceiling (2 procs, no comm)",
    "overhead": "tnt 1 rank step time over plain Keras",
    "sync_bn": "tnt 2 ranks step time, SyncBatchNormalization over BatchNormalization",
    "elastic": "tnt 2 ranks step time, --elastic over without",
}
# Issue 43: what an elastic job may cost while nothing fails, on every model and backend (percent).
ELASTIC_BAR = 2.0
# Cores of other work during the timed rounds above which the result gets a warning.
BUSY_OTHER_LOAD = 0.25


@dataclass(frozen=True)
class Bench:
    """How one model is benchmarked, and the bars tnt has to meet on it."""

    title: str
    batch: int  # global batch size
    steps: int  # per round
    rounds: int  # per start
    samples: int  # synthetic samples, cached and repeated
    timeout: float  # stall timeout of one start, in seconds
    # ratio key (see RATIOS) -> bar: at least that for samples/s ratios, below it for the overhead
    targets: dict[str, float]
    # the same on the torch backend
    torch_targets: dict[str, float] = field(default_factory=dict)
    # the same on the JAX backend
    jax_targets: dict[str, float] = field(default_factory=dict)

    def bars(self, backend: str) -> dict[str, float]:
        return {"torch": self.torch_targets, "jax": self.jax_targets}.get(backend, self.targets)


# Issue 28, section 3: the bars on the torch backend, for every model.
TORCH_TARGETS = {"ceiling": 0.95, "ddp": 1.5, "overhead": 3.0}
# Issue 40, section 3: the bars on the JAX backend (LeNet-5; the two large models below).
JAX_TARGETS = {"ceiling": 0.90, "dp": 1.5, "overhead": 3.0}
JAX_LARGE_TARGETS = {"ceiling": 0.90, "dp": 1.2, "overhead": 3.0}
BENCHES = {
    # Issue 11's first targets, on a model too small to stress fusion or overlap.
    "lenet": Bench(
        "LeNet-5", 256, 100, 5, 4096, 120.0, {"keras": 1.5, "mwms": 2.0, "overhead": 3.0}, TORCH_TARGETS, JAX_TARGETS
    ),
    # Issue 11, section 6: 25M-parameter models, with a step of about a second on 2 cores.
    "resnet50": Bench(
        "ResNet-50, 32x32x3", 16, 5, 3, 256, 600.0, {"ceiling": 0.95, "mwms": 1.5, "overhead": 3.0}, TORCH_TARGETS,
        JAX_LARGE_TARGETS,
    ),
    "transformer": Bench(
        "Transformer encoder, 6 x 512, 32 tokens",
        16,
        5,
        3,
        256,
        600.0,
        {"ceiling": 0.95, "mwms": 1.5, "overhead": 3.0},
        TORCH_TARGETS,
        JAX_LARGE_TARGETS,
    ),
}


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    mode: str  # the worker's MODE
    ranks: int
    launcher: bool  # started through tnt-launch
    backends: tuple[str, ...] = BACKENDS  # where it exists
    env: tuple[tuple[str, str], ...] = ()  # set for its processes
    models: tuple[str, ...] | None = None  # the models it runs for (None: every model)
    launch_args: tuple[str, ...] = ()  # more of tnt-launch's options


CONFIGS = [
    Config("keras", "plain Keras, 1 process", "keras", 1, False),
    Config("tnt1", "tnt, 1 rank", "tnt", 1, True),
    Config("tnt2", "tnt, 2 ranks", "tnt", 2, True),
    # tnt's way before XLA's handler: the ordered callbacks into tnt-comm (docs/keras.md).
    Config("tnt2cb", "tnt, 2 ranks, ordered callbacks", "tnt", 2, True, ("jax",), (("TNT_KERAS_JAX_SUM", "callback"),)),
    # What synchronized BatchNormalization costs: ResNet-50's 53 BatchNormalization layers as
    # tnt.SyncBatchNormalization (_training_worker.py: resnet50), the other models have none.
    Config(
        "tnt2sbn", "tnt, 2 ranks, SyncBatchNormalization", "tnt", 2, True, env=(("BENCH_SYNC_BN", "1"),),
        models=("resnet50",),
    ),
    # What an elastic job costs while nothing fails: a copy of the variables per epoch (keras.md).
    Config("tnt2el", "tnt, 2 ranks, --elastic 1", "tnt", 2, True, launch_args=("--elastic", "1")),
    Config("mwms", "MWMS, 2 workers", "mwms", 2, False, ("tensorflow",)),
    Config("ddp", "torch DDP (gloo), 2 procs", "ddp", 2, False, ("torch",)),
    Config("dp", "Keras DataParallel (jax.distributed), 2 procs", "dp", 2, False, ("jax",)),
    # Not a competitor: two plain Keras processes, each on half of every batch, never talking.
    Config("ceiling", "ceiling: 2 procs, no comm", "solo", 2, False),
]
BY_KEY = {c.key: c for c in CONFIGS}


def backend_configs(backend: str) -> list[str]:
    """The configurations that exist on ``backend``, in table order."""
    return [c.key for c in CONFIGS if backend in c.backends]


@dataclass
class Run:
    """One configuration started once (one pass): its rounds, or why there are none."""

    key: str
    status: str  # ok, not installed, failed, timeout
    detail: str = ""
    wall_s: float = 0.0
    # seconds, cpu_seconds (all ranks), machine_busy_seconds, loss
    rounds: list[dict[str, float]] = field(default_factory=list)
    warmup_s: float = 0.0
    parameters: int = 0
    threads: dict[str, object] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


@dataclass
class Summary:
    """All rounds of all passes of one configuration."""

    key: str
    status: str
    detail: str
    rounds: int = 0
    samples_s: float = 0.0  # median
    samples_s_min: float = 0.0
    samples_s_max: float = 0.0
    step_ms: float = 0.0  # median
    cores: float | None = None  # median CPU time / wall time, summed over ranks
    other_load: float | None = None  # median cores busy with anything else during the rounds
    loss: float | None = None  # mean loss of the last round of the first pass (same data, steps and seed)
    parameters: int = 0
    threads: dict[str, object] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)


# --- launching ----------------------------------------------------------------------------------


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def tnt_launch() -> list[str] | None:
    """The launcher CLI: ``tnt-launch`` beside this Python, else on PATH, else ``python -m tnt_launch``."""
    beside = Path(sys.executable).parent / "tnt-launch"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("tnt-launch")
    if found:
        return [found]
    if importlib.util.find_spec("tnt_launch") is not None:
        return [sys.executable, "-m", "tnt_launch"]
    return None


def tnt_keras_source() -> str | None:
    """Where workers import tnt_keras from: None when it is installed, else the repository's source
    tree (added to PYTHONPATH); raises LookupError when neither exists."""
    if importlib.util.find_spec("tnt_keras") is not None:
        return None
    if (TNT_KERAS_SRC / "tnt_keras" / "__init__.py").is_file():
        return str(TNT_KERAS_SRC)
    raise LookupError("tnt_keras is not installed")


def missing(config: Config) -> str | None:
    """Why a configuration cannot run here, or None."""
    if config.mode == "tnt":
        try:
            tnt_keras_source()
        except LookupError:
            return "not installed (tnt_keras)"
        if tnt_launch() is None:
            return "not installed (tnt-launch)"
    return None


def base_env(workdir: Path, backend: str = "tensorflow") -> dict[str, str]:
    drop = THREAD_VARIABLES + CONTRACT_VARIABLES + TORCH_DIST_VARIABLES
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.pop("TF_CONFIG", None)
    env.update(
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        CUDA_VISIBLE_DEVICES="",
        KERAS_BACKEND=backend,
        BENCH_DIR=str(workdir),
    )
    try:
        source = tnt_keras_source()
    except LookupError:
        source = None
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    return env


def thread_env(ranks: int, backend: str = "tensorflow") -> dict[str, str]:
    """What tnt-launch sets for each rank unless the user did: OMP_NUM_THREADS and TF's intra-op
    thread count (TensorFlow), or OMP_NUM_THREADS and MKL_NUM_THREADS, from which torch sizes its
    intra-op pool (torch), all the cores per rank. The MWMS and DDP processes and the ceiling's get
    the same; plain Keras gets nothing (the framework's defaults: TF's intra- and inter-op pools as
    large as the machine, torch's intra-op pool one thread per core)."""
    threads = str(max(1, cpus() // ranks))
    if backend == "jax":  # XLA's only thread count: one, as tnt-launch sets it for a rank's share of one CPU
        return {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"} if threads == "1" else {}
    if backend == "torch":
        return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return {"OMP_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads}


def commands(config: Config, args: argparse.Namespace, workdir: Path) -> list[_ranks.Command]:
    script = [
        str(WORKER),
        config.mode,
        f"--model={args.model}",
        f"--steps={args.steps}",
        f"--rounds={args.rounds}",
        f"--batch={args.batch}",
        f"--samples={args.samples}",
        f"--seed={args.seed}",
    ]
    env = {**base_env(workdir, args.backend), **dict(config.env)}
    if config.launcher:
        # The launcher sets the contract and the thread variables for every rank (unless set).
        argv = [*(tnt_launch() or []), "-n", str(config.ranks), "--no-gpu", *config.launch_args]
        argv += ["--python-interpreter", sys.executable, "--", *script]
        return [_ranks.Command(argv, env)]
    if config.mode == "keras":
        return [_ranks.Command([sys.executable, *script], env)]
    if config.mode == "solo":
        shared = {**env, **thread_env(config.ranks, args.backend), "BENCH_SIZE": str(config.ranks)}
        return [
            _ranks.Command([sys.executable, *script], {**shared, "BENCH_RANK": str(r)}) for r in range(config.ranks)
        ]
    if config.mode in ("ddp", "dp"):
        # torch.distributed's env:// rendezvous (ddp) or jax.distributed's coordinator (dp) on a free
        # localhost port; Gloo over the loopback device.
        shared = {
            **env,
            **thread_env(config.ranks, args.backend),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_ranks.free_port()),
            "WORLD_SIZE": str(config.ranks),
            "LOCAL_WORLD_SIZE": str(config.ranks),
            "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
        }
        return [
            _ranks.Command([sys.executable, *script], {**shared, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(config.ranks)
        ]
    # MWMS: one process per worker, a cluster of localhost ports in TF_CONFIG.
    hosts = [f"127.0.0.1:{_ranks.free_port()}" for _ in range(config.ranks)]
    cmds = []
    for index in range(config.ranks):
        tf_config = {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}}
        rank_env = {**env, **thread_env(config.ranks), "TF_CONFIG": json.dumps(tf_config)}
        cmds.append(_ranks.Command([sys.executable, *script], rank_env))
    return cmds


def run_config(config: Config, args: argparse.Namespace) -> Run:
    reason = missing(config)
    if reason:
        return Run(config.key, "not installed", reason)
    start = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"training-{config.key}-"))
    try:
        with _ranks.Job(commands(config, args, workdir), workdir, worker.MARKER) as job:
            outcome = job.wait(args.timeout)
        run = collect(config, workdir, outcome)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run.wall_s = time.monotonic() - start
    return run


def collect(config: Config, workdir: Path, outcome: _ranks.Outcome) -> Run:
    """Rank 0's JSON line (from its output) gives the rounds; every rank's result file adds its CPU
    time, so that a round's cpu_seconds cover all ranks."""
    result = None
    for line in outcome.logs.get("proc0.log", "").splitlines():
        _, marker, payload = line.partition(worker.RESULT_PREFIX)
        if marker:
            try:
                result = json.loads(payload)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
    if outcome.status != "ok" or result is None:
        status = outcome.status if outcome.status != "ok" else "failed"
        detail = outcome.detail or "rank 0 printed no result"
        return Run(config.key, status, detail + "\n" + _ranks.log_tail(outcome.logs))
    if int(result["size"]) != config.ranks:
        return Run(config.key, "failed", f"ran with {result['size']} ranks, not {config.ranks}")
    rounds = [dict(r) for r in result["rounds"]]
    per_rank = []
    for rank in range(1, config.ranks):
        path = workdir / f"{config.mode}.r{rank}.json"
        try:
            per_rank.append(json.loads(path.read_text())["rounds"])
        except (OSError, ValueError, KeyError):
            per_rank.append([])
    for i, record in enumerate(rounds):
        others = [r[i]["cpu_seconds"] for r in per_rank if len(r) > i]
        record["cpu_seconds"] = record["cpu_seconds"] + sum(others) if len(others) == len(per_rank) else None
        if config.mode == "solo":  # unsynchronised processes: a global step is done when the slowest is
            record["seconds"] = max([record["seconds"], *(r[i]["seconds"] for r in per_rank if len(r) > i)])
    return Run(
        config.key,
        "ok",
        rounds=rounds,
        warmup_s=float(result["warmup"][0]["seconds"]) if result["warmup"] else 0.0,
        parameters=int(result.get("parameters", 0)),
        threads=dict(result.get("threads", {})),
        versions=dict(result.get("versions", {})),
    )


# --- summarising --------------------------------------------------------------------------------


def summarise(config: Config, runs: list[Run], args: argparse.Namespace) -> Summary:
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        first = runs[0] if runs else Run(config.key, "not run")
        return Summary(config.key, first.status, first.detail)
    step_s = [r["seconds"] / args.steps for run in ok for r in run.rounds]
    rates = [args.batch / s for s in step_s]
    cores = [r["cpu_seconds"] / r["seconds"] for run in ok for r in run.rounds if r.get("cpu_seconds") is not None]
    other = [
        max(0.0, r["machine_busy_seconds"] - r["cpu_seconds"]) / r["seconds"]
        for run in ok
        for r in run.rounds
        if r.get("cpu_seconds") is not None and math.isfinite(r.get("machine_busy_seconds", math.nan))
    ]
    bad = [r for r in runs if r.status != "ok"]
    return Summary(
        config.key,
        "ok",
        "; ".join(f"pass failed: {r.status}" for r in bad),
        rounds=len(step_s),
        samples_s=statistics.median(rates),
        samples_s_min=min(rates),
        samples_s_max=max(rates),
        step_ms=statistics.median(step_s) * 1e3,
        cores=statistics.median(cores) if len(cores) == len(step_s) else None,
        other_load=statistics.median(other) if len(other) == len(step_s) else None,
        loss=ok[0].rounds[-1].get("loss") if ok[0].rounds else None,
        parameters=ok[0].parameters,
        threads=ok[0].threads,
        versions=ok[0].versions,
    )


def threads_text(config: Config, summary: Summary) -> str:
    threads = summary.threads
    intra = threads.get("intra_op") or 0
    if threads.get("backend") == "jax":  # XLA sizes its CPU pool from the process's CPUs, or has one thread
        if "--xla_cpu_multi_thread_eigen=false" in (threads.get("XLA_FLAGS") or ""):
            return "XLA, 1 thread"
        return f"XLA default ({threads.get('cpus', cpus())} CPUs)"
    if threads.get("backend") == "torch":
        if not (threads.get("OMP_NUM_THREADS") or threads.get("MKL_NUM_THREADS")):
            return f"torch default ({intra})"
        return f"intra-op {intra}, OMP {threads.get('OMP_NUM_THREADS')}"
    if not intra:
        return f"TF default ({threads.get('cpus', cpus())})"
    return f"intra-op {intra}, OMP {threads.get('OMP_NUM_THREADS')}"


def ratio(a: Summary | None, b: Summary | None) -> float | None:
    if a is None or b is None or a.status != "ok" or b.status != "ok":
        return None
    return a.samples_s / b.samples_s


def checks(summaries: dict[str, Summary], bench: Bench, backend: str = "tensorflow") -> list[tuple[str, str, str, str]]:
    """(what, measured, bar, verdict) for every ratio of RATIOS whose baseline exists on ``backend``;
    a ratio without a bar for this model is shown as context ("info")."""
    rows = []
    tnt1, tnt2, keras = (summaries.get(k) for k in ("tnt1", "tnt2", "keras"))
    targets = bench.bars(backend)
    for key, what in RATIOS.items():
        if key in BY_KEY and backend not in BY_KEY[key].backends:
            continue
        if key == "sync_bn" and "tnt2sbn" not in summaries:  # a model without BatchNormalization
            continue
        if key == "elastic" and "tnt2el" not in summaries:
            continue
        bar = ELASTIC_BAR if key == "elastic" else targets.get(key)
        if key in ("overhead", "sync_bn", "elastic"):
            measured = None
            slower, base = {
                "overhead": (tnt1, keras),
                "sync_bn": (summaries.get("tnt2sbn"), tnt2),
                "elastic": (summaries.get("tnt2el"), tnt2),
            }[key]
            if slower is not None and base is not None and slower.status == "ok" and base.status == "ok":
                measured = (slower.step_ms / base.step_ms - 1) * 100
            text = "-" if measured is None else f"{measured:+.1f}%"
            bar_text = "(context)" if bar is None else f"< {bar:.0f}%"
            met = measured is not None and bar is not None and measured < bar
        else:
            measured = ratio(tnt2, summaries.get(key))
            text = "-" if measured is None else f"{measured:.2f}x"
            bar_text = "(context)" if bar is None else f">= {bar:.2f}x"
            met = measured is not None and bar is not None and measured >= bar
        if measured is None:
            verdict = "not measured" if bar is not None else "-"
        elif bar is None:
            verdict = "info"
        else:
            verdict = "met" if met else "NOT met"
        rows.append((what, text, bar_text, verdict))
    return rows


# --- reporting ----------------------------------------------------------------------------------

HEADERS = [
    "config",
    "ranks",
    "threads/rank",
    "samples/s",
    "min-max",
    "step time",
    "vs Keras",
    "cores used",
    "other load",
    "rounds",
    "loss",
]


def rate(samples_s: float) -> str:
    """Samples/s to three significant digits at least (the large models do a few per second)."""
    return f"{samples_s:,.0f}" if samples_s >= 100 else f"{samples_s:.3g}"


def table_rows(summaries: dict[str, Summary]) -> list[list[str]]:
    rows = []
    keras = summaries.get("keras")
    for key, summary in summaries.items():
        config = BY_KEY[key]
        if summary.status != "ok":
            rows.append([config.label, str(config.ranks), "-", summary.status, *["-"] * 7])
            continue
        versus = ratio(summary, keras)
        rows.append(
            [
                config.label,
                str(config.ranks),
                threads_text(config, summary),
                rate(summary.samples_s),
                f"{rate(summary.samples_s_min)}-{rate(summary.samples_s_max)}",
                f"{summary.step_ms:.2f} ms",
                f"{versus:.2f}x" if versus is not None else "-",
                f"{summary.cores:.2f}" if summary.cores is not None else "-",
                f"{summary.other_load:.2f}" if summary.other_load is not None else "-",
                str(summary.rounds),
                f"{summary.loss:.5f}" if summary.loss is not None else "-",
            ]
        )
    return rows


def describe(args: argparse.Namespace, summaries: dict[str, Summary]) -> str:
    """The model, its size and the run's settings, for a table's or a plot panel's title."""
    parameters = max((s.parameters for s in summaries.values()), default=0)
    size = f", {parameters / 1e6:.1f}M parameters" if parameters >= 1e6 else f", {parameters / 1e3:.1f}k parameters"
    on = {"torch": "Keras on torch", "jax": "Keras on JAX"}.get(backend_of(args), "Keras on TensorFlow")
    return (
        f"{BENCHES[args.model].title}{size if parameters else ''}, {on}, global batch {args.batch}, {cpus()} cores: "
        f"median over {args.passes} pass(es) x {args.rounds} rounds of {args.steps} steps"
    )


def backend_of(args: argparse.Namespace) -> str:
    """The run's backend (runs saved before there was a choice were TensorFlow's)."""
    return getattr(args, "backend", None) or "tensorflow"


def versions_text(summaries: dict[str, Summary]) -> str:
    versions: dict[str, str] = {}
    for summary in summaries.values():
        versions.update(summary.versions)
    return ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))


def print_tables(measured: dict[str, tuple[argparse.Namespace, dict[str, Summary]]]) -> None:
    """One table and one targets table per model, then every model's targets in one summary."""
    check_headers = ["target", "measured", "bar", "verdict"]
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    summary_rows = []
    for model, (args, summaries) in measured.items():
        heading = describe(args, summaries)
        versions = versions_text(summaries)
        if versions:
            heading += f"\n({versions})"
        tables.append((heading, HEADERS, table_rows(summaries)))
        check_rows = [list(r) for r in checks(summaries, BENCHES[model], backend_of(args))]
        tables.append((f"tnt targets: {BENCHES[model].title}", check_headers, check_rows))
        summary_rows += [[model, *r] for r in check_rows if r[2] != "(context)"]
    tables.append(("all targets", ["model", *check_headers], summary_rows))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for heading, headers, rows in tables:
            print_plain(heading, headers, rows)
        return
    console = Console() if sys.stdout.isatty() else Console(width=170)
    for heading, headers, rows in tables:
        table = Table(title=heading)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)


def print_plain(heading: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    print(heading)
    for row in [headers, ["-" * w for w in widths], *rows]:
        cells = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        print(" | ".join(cells))
    print()


SHORT = {
    "keras": "plain Keras", "mwms": "MWMS", "ddp": "DDP-gloo", "dp": "Keras DataParallel", "ceiling": "the ceiling"
}
COLORS = {
    "keras": "tab:gray",
    "tnt1": "tab:orange",
    "tnt2": "tab:red",
    "tnt2cb": "tab:pink",
    "tnt2sbn": "tab:olive",
    "tnt2el": "tab:cyan",
    "mwms": "tab:blue",
    "ddp": "tab:purple",
    "dp": "tab:brown",
    "ceiling": "tab:green",
}


def plot(measured: dict[str, tuple[argparse.Namespace, dict[str, Summary]]], out: Path) -> bool:
    """One panel per model: every configuration's median samples/s with its min-max, and the bars
    for tnt 2 ranks that are ratios to another configuration as dashed lines."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, len(measured), figsize=(7.5 * len(measured), 5.8), squeeze=False)
    versions: dict[str, str] = {}
    busiest = 0.0
    for ax, (model, (args, summaries)) in zip(axes[0], measured.items(), strict=True):
        panel(ax, model, args, summaries)
        for summary in summaries.values():
            versions.update(summary.versions)
            busiest = max(busiest, summary.other_load or 0.0)
    heading = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    if busiest > BUSY_OTHER_LOAD:
        heading += f"; machine busy with other work (up to {busiest:.2f} cores, median per config): noisy"
    fig.suptitle(heading, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def panel(ax: object, model: str, args: argparse.Namespace, summaries: dict[str, Summary]) -> None:
    keys = list(summaries)
    keras = summaries.get("keras")
    targets = []
    for key, bar in BENCHES[model].bars(backend_of(args)).items():
        base = summaries.get(key)
        if key in COLORS and base is not None and base.status == "ok":
            label = f"target for tnt 2 ranks: {bar:.2f}x {SHORT[key]}"
            targets.append((base.samples_s * bar, COLORS[key], label))
    ok = [s for s in summaries.values() if s.status == "ok"]
    top = max([s.samples_s_max for s in ok] + [t[0] for t in targets], default=1.0)
    for i, key in enumerate(keys):
        summary = summaries[key]
        if summary.status != "ok":
            ax.text(i, top * 0.02, summary.status, ha="center", va="bottom", rotation=90, color="0.4")
            continue
        low = summary.samples_s - summary.samples_s_min
        high = summary.samples_s_max - summary.samples_s
        ax.bar(i, summary.samples_s, color=COLORS[key], yerr=[[low], [high]], capsize=6)
        label = rate(summary.samples_s)
        baselines = (
            ("Keras", keras),
            ("MWMS", summaries.get("mwms")),
            ("DDP", summaries.get("ddp")),
            ("DataParallel", summaries.get("dp")),
            ("ceiling", summaries.get("ceiling")),
        )
        for name, base in baselines:
            versus = ratio(summary, base)
            if versus is not None and base is not summary and (name == "Keras" or key == "tnt2"):
                label += f"\n{versus:.2f}x {name}"
        ax.text(i, summary.samples_s_max + top * 0.01, label, ha="center", va="bottom", fontsize=8)
    for value, color, text in targets:
        ax.axhline(value, color=color, linestyle="--", linewidth=1, label=text)
    if targets:
        ax.legend(loc="upper left", fontsize=8)
    # Wrapped to a bar's width: seven configurations share a panel on JAX.
    names = [textwrap.fill(BY_KEY[k].label, 16, break_long_words=False) for k in keys]
    ax.set_xticks(range(len(keys)), names, fontsize=8)
    ax.set_ylabel("global samples/s (median; bars: min-max over rounds)")
    ax.set_ylim(0, top * 1.45)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(describe(args, summaries).replace(": median", ":\nmedian", 1), fontsize=9)


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="tensorflow",
        help="Keras' backend in every worker (default: tensorflow); torch runs DDP instead of MWMS",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(BENCHES),
        default=list(BENCHES),
        help="models to run, one after the other, each in every configuration (default: all three)",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(BY_KEY),
        default=None,
        help="configurations to run (default: all of the backend's): keras, tnt1, tnt2, mwms (TensorFlow), "
        "ddp (torch), ceiling",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=2,
        help="start every configuration this many times, alternating; all rounds count (default: 2)",
    )
    # Options whose default is each model's own, from BENCHES: (name, type, what it sets).
    for name, kind, what in (
        ("rounds", int, "timed rounds (epochs) per start"),
        ("steps", int, "steps per round; the warm-up is one more such epoch"),
        ("batch", int, "global batch size"),
        ("samples", int, "synthetic samples, cached and repeated"),
        ("timeout", float, "stop a configuration that finishes no epoch for this many seconds"),
    ):
        defaults = ", ".join(f"{k} {getattr(b, name):g}" for k, b in BENCHES.items())
        parser.add_argument(f"--{name}", type=kind, help=f"{what} (default: per model, see BENCHES: {defaults})")
    parser.add_argument("--seed", type=int, default=1234, help="seed of data and weights (default: 1234)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 pass, 2 rounds of a fifth of each model's steps"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="PNG plot (default: docs/training.png, with --backend torch docs/training_torch.png)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write all numbers to this JSON file")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="run nothing: print the tables and draw the plot from a file written by --json",
    )
    args = parser.parse_args(argv)
    available = backend_configs(args.backend)
    if args.configs is None:
        args.configs = available
    elif any(c not in available for c in args.configs):
        parser.error(f"--backend {args.backend} runs only the configurations {', '.join(available)}")
    if args.out is None:
        args.out = REPO / "docs" / {"torch": "training_torch.png", "jax": "training_jax.png"}.get(
            args.backend, "training.png"
        )
    if args.quick:
        args.passes, args.rounds = 1, 2
    given = [v for v in (args.rounds, args.steps, args.batch, args.samples) if v is not None]
    if min([args.passes, *given]) < 1:
        parser.error("--passes, --rounds, --steps, --batch and --samples must be positive")
    for model in args.models:
        settings = model_args(args, model)
        if settings.samples < settings.batch:
            parser.error(f"{model}: --samples ({settings.samples}) must be at least --batch ({settings.batch})")
    return args


def model_args(args: argparse.Namespace, model: str) -> argparse.Namespace:
    """The settings of one model's runs: the command line's, where given, else the model's own."""
    bench = BENCHES[model]
    settings = argparse.Namespace(**vars(args))
    settings.model = model
    steps = bench.steps if not args.quick else max(1, bench.steps // 5)
    for name, default in (
        ("rounds", bench.rounds),
        ("steps", steps),
        ("batch", bench.batch),
        ("samples", bench.samples),
        ("timeout", bench.timeout),
    ):
        if getattr(args, name) is None:
            setattr(settings, name, default)
    return settings


def run_all(args: argparse.Namespace) -> dict[str, list[Run]]:
    """Pass by pass, one configuration after the other; the order rotates between passes so that
    none always runs first (or last) on a machine whose speed drifts."""
    keys = [c.key for c in CONFIGS if c.key in args.configs and (c.models is None or args.model in c.models)]
    results: dict[str, list[Run]] = {key: [] for key in keys}
    for pass_ in range(args.passes):
        shift = pass_ % len(keys)
        for key in keys[shift:] + keys[:shift]:
            done = results[key]
            if done and done[-1].status != "ok":
                continue  # not installed, failed or hung once: not tried again
            print(
                f"[{args.model}, pass {pass_ + 1}/{args.passes}] {BY_KEY[key].label} ...",
                end=" ",
                file=sys.stderr,
                flush=True,
            )
            run = run_config(BY_KEY[key], args)
            done.append(run)
            note = ""
            if run.status == "ok":
                rates = [args.batch * args.steps / r["seconds"] for r in run.rounds]
                note = f", {statistics.median(rates):,.1f} samples/s"
            print(f"{run.status} ({run.wall_s:.1f} s{note})", file=sys.stderr, flush=True)
            if run.status not in ("ok", "not installed"):
                print(run.detail, file=sys.stderr, flush=True)
    return results


SETTINGS = ("model", "backend", "passes", "rounds", "steps", "batch", "samples", "seed", "timeout")


def from_json(path: Path) -> dict[str, tuple[argparse.Namespace, dict[str, Summary]]]:
    """The summaries a run saved with --json, each model under that run's settings."""
    payload = json.loads(path.read_text())
    return {
        model: (
            argparse.Namespace(
                **{k: saved["settings"].get(k, "tensorflow" if k == "backend" else None) for k in SETTINGS}
            ),
            {key: Summary(**fields) for key, fields in saved["summaries"].items()},
        )
        for model, saved in payload["models"].items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        measured = from_json(args.from_json)
        print_tables(measured)
        if plot(measured, args.out):
            print(f"plot: {args.out}")
        return 0
    started = time.monotonic()
    measured = {}
    results = {}
    with _ranks.terminate_as_interrupt():
        for model in args.models:
            settings = model_args(args, model)
            results[model] = run_all(settings)
            summaries = {key: summarise(BY_KEY[key], runs, settings) for key, runs in results[model].items()}
            measured[model] = (settings, summaries)
    print_tables(measured)
    for model, (_, summaries) in measured.items():
        busy = [BY_KEY[k].label for k, s in summaries.items() if (s.other_load or 0.0) > BUSY_OTHER_LOAD]
        if busy:
            print(
                f"note ({model}): other work kept more than {BUSY_OTHER_LOAD:.2f} cores busy (median) during the "
                "rounds of: " + ", ".join(busy) + "; those numbers are not comparable with a quiet machine's"
            )
    if plot(measured, args.out):
        print(f"plot: {args.out}")
    if args.json:
        payload = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "models": {
                model: {
                    "settings": {k: getattr(settings, k) for k in SETTINGS},
                    "summaries": {k: asdict(s) for k, s in summaries.items()},
                    "checks": checks(summaries, BENCHES[model], settings.backend),
                    "runs": {k: [asdict(r) for r in runs] for k, runs in results[model].items()},
                }
                for model, (settings, summaries) in measured.items()
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"numbers: {args.json}")
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    _ranks.run_main(main)
