"""Training throughput benchmark: tnt_keras against plain Keras and MultiWorkerMirroredStrategy.

Trains a LeNet-5-like CNN on synthetic MNIST-shaped data (global batch 256, SGD, sparse categorical
crossentropy) in five configurations, each in fresh processes started by this driver one after the
other: plain Keras in one process, tnt with 1 rank and with 2 ranks (through ``tnt-launch``),
tf.distribute.MultiWorkerMirroredStrategy with 2 workers, and as context the machine's ceiling for
2 ranks: two plain Keras processes, each on half of every batch, with no communication. Prints the
median throughput in global samples per second, its spread and the step time, checks tnt's
targets, and writes a bar chart.

    python benchmarks/training.py [--quick] [--passes P] [--rounds R] [--steps M]
                                  [--configs keras tnt1 tnt2 mwms ceiling] [--out docs/training.png]

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
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import _ranks
import _training_worker as worker

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_training_worker.py"
TNT_KERAS_SRC = REPO / "packages" / "tnt-keras" / "src"

# Thread settings are part of each configuration (see thread_env); inherited ones would blur them.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
# The launcher's contract: a leftover from the calling shell must not turn a worker into a rank.
CONTRACT_VARIABLES = (
    "TNT_RANK",
    "TNT_SIZE",
    "TNT_LOCAL_RANK",
    "TNT_LOCAL_SIZE",
    "TNT_NODE_RANK",
    "TNT_MASTER_ADDR",
    "TNT_MASTER_PORT",
    "TNT_JOB_ID",
    "TNT_JOB_TOKEN",
)

# The targets tnt is built to (checked in the second table).
SPEEDUP_VS_KERAS = 1.5  # tnt 2 ranks / plain Keras in one process, at least
SPEEDUP_VS_MWMS = 2.0  # tnt 2 ranks / MWMS 2 workers, at least
OVERHEAD_1RANK_PCT = 3.0  # tnt 1 rank step time over plain Keras, below
# Cores of other work during the timed rounds above which the result gets a warning.
BUSY_OTHER_LOAD = 0.25


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    mode: str  # the worker's MODE
    ranks: int
    launcher: bool  # started through tnt-launch


CONFIGS = [
    Config("keras", "plain Keras, 1 process", "keras", 1, False),
    Config("tnt1", "tnt, 1 rank", "tnt", 1, True),
    Config("tnt2", "tnt, 2 ranks", "tnt", 2, True),
    Config("mwms", "MWMS, 2 workers", "mwms", 2, False),
    # Not a competitor: two plain Keras processes, each on half of every batch, never talking.
    Config("ceiling", "ceiling: 2 procs, no comm", "solo", 2, False),
]
BY_KEY = {c.key: c for c in CONFIGS}


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


def base_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES + CONTRACT_VARIABLES}
    env.pop("TF_CONFIG", None)
    env.update(
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL=env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        CUDA_VISIBLE_DEVICES="",
        BENCH_DIR=str(workdir),
    )
    try:
        source = tnt_keras_source()
    except LookupError:
        source = None
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH", "")) if p)
    return env


def thread_env(ranks: int) -> dict[str, str]:
    """What tnt-launch sets for each rank unless the user did: OMP_NUM_THREADS and TF's intra-op
    thread count, both the cores per rank. The MWMS workers get the same; plain Keras gets nothing
    (TF's defaults: intra- and inter-op pools as large as the machine)."""
    threads = str(max(1, cpus() // ranks))
    return {"OMP_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads}


def commands(config: Config, args: argparse.Namespace, workdir: Path) -> list[_ranks.Command]:
    script = [
        str(WORKER),
        config.mode,
        f"--steps={args.steps}",
        f"--rounds={args.rounds}",
        f"--batch={args.batch}",
        f"--samples={args.samples}",
        f"--seed={args.seed}",
    ]
    env = base_env(workdir)
    if config.launcher:
        # The launcher sets the contract and the thread variables for every rank (unless set).
        argv = [*(tnt_launch() or []), "-n", str(config.ranks), "--no-gpu"]
        argv += ["--python-interpreter", sys.executable, "--", *script]
        return [_ranks.Command(argv, env)]
    if config.mode == "keras":
        return [_ranks.Command([sys.executable, *script], env)]
    if config.mode == "solo":
        shared = {**env, **thread_env(config.ranks), "BENCH_SIZE": str(config.ranks)}
        return [
            _ranks.Command([sys.executable, *script], {**shared, "BENCH_RANK": str(r)}) for r in range(config.ranks)
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
        return Run(config.key, status, detail + "\n" + log_tail(outcome.logs))
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
        threads=dict(result.get("threads", {})),
        versions=dict(result.get("versions", {})),
    )


def log_tail(logs: dict[str, str], lines: int = 15) -> str:
    parts = []
    for name, text in sorted(logs.items()):
        tail = [line for line in text.splitlines() if line.strip()][-lines:]
        if tail:
            parts.append(f"--- {name} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(parts)


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
        threads=ok[0].threads,
        versions=ok[0].versions,
    )


def threads_text(config: Config, summary: Summary) -> str:
    threads = summary.threads
    intra = threads.get("intra_op") or 0
    if not intra:
        return f"TF default ({threads.get('cpus', cpus())})"
    return f"intra-op {intra}, OMP {threads.get('OMP_NUM_THREADS')}"


def ratio(a: Summary | None, b: Summary | None) -> float | None:
    if a is None or b is None or a.status != "ok" or b.status != "ok":
        return None
    return a.samples_s / b.samples_s


def checks(summaries: dict[str, Summary]) -> list[tuple[str, str, str, str]]:
    """(what, measured, target, verdict) for tnt's three targets, and its share of the ceiling."""
    rows = []
    keras, tnt1, tnt2, mwms = (summaries.get(k) for k in ("keras", "tnt1", "tnt2", "mwms"))
    for what, value, target in (
        ("tnt 2 ranks / plain Keras 1 process", ratio(tnt2, keras), SPEEDUP_VS_KERAS),
        ("tnt 2 ranks / MWMS 2 workers", ratio(tnt2, mwms), SPEEDUP_VS_MWMS),
    ):
        if value is None:
            rows.append((what, "-", f">= {target:.1f}x", "not measured"))
        else:
            rows.append((what, f"{value:.2f}x", f">= {target:.1f}x", "met" if value >= target else "NOT met"))
    what = "tnt 1 rank step time over plain Keras"
    if tnt1 is None or keras is None or tnt1.status != "ok" or keras.status != "ok":
        rows.append((what, "-", f"< {OVERHEAD_1RANK_PCT:.0f}%", "not measured"))
    else:
        overhead = (tnt1.step_ms / keras.step_ms - 1) * 100
        verdict = "met" if overhead < OVERHEAD_1RANK_PCT else "NOT met"
        rows.append((what, f"{overhead:+.1f}%", f"< {OVERHEAD_1RANK_PCT:.0f}%", verdict))
    # No target: how much of what the machine allows 2 ranks (compute without communication) tnt gets.
    share = ratio(tnt2, summaries.get("ceiling"))
    what = "tnt 2 ranks / ceiling (2 procs, no comm)"
    rows.append((what, "-" if share is None else f"{share:.2f}x", "(context)", "-" if share is None else "info"))
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
                f"{summary.samples_s:,.0f}",
                f"{summary.samples_s_min:,.0f}-{summary.samples_s_max:,.0f}",
                f"{summary.step_ms:.2f} ms",
                f"{versus:.2f}x" if versus is not None else "-",
                f"{summary.cores:.2f}" if summary.cores is not None else "-",
                f"{summary.other_load:.2f}" if summary.other_load is not None else "-",
                str(summary.rounds),
                f"{summary.loss:.5f}" if summary.loss is not None else "-",
            ]
        )
    return rows


def title(args: argparse.Namespace, summaries: dict[str, Summary]) -> str:
    versions: dict[str, str] = {}
    for summary in summaries.values():
        versions.update(summary.versions)
    text = (
        f"LeNet-5 training, global batch {args.batch}, {cpus()} cores: median over "
        f"{args.passes} pass(es) x {args.rounds} rounds of {args.steps} steps"
    )
    if versions:
        text += "\n(" + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ")"
    return text


def print_tables(args: argparse.Namespace, summaries: dict[str, Summary]) -> None:
    rows = table_rows(summaries)
    check_rows = [list(r) for r in checks(summaries)]
    check_headers = ["target", "measured", "bar", "verdict"]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print_plain(title(args, summaries), HEADERS, rows)
        print_plain("tnt targets", check_headers, check_rows)
        return
    console = Console() if sys.stdout.isatty() else Console(width=170)
    table = Table(title=title(args, summaries))
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    targets = Table(title="tnt targets")
    for i, header in enumerate(check_headers):
        targets.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    for row in check_rows:
        targets.add_row(*row)
    console.print(targets)


def print_plain(heading: str, headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    print(heading)
    for row in [headers, ["-" * w for w in widths], *rows]:
        cells = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        print(" | ".join(cells))
    print()


def plot(args: argparse.Namespace, summaries: dict[str, Summary], out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written", file=sys.stderr)
        return False
    colors = {"keras": "tab:gray", "tnt1": "tab:orange", "tnt2": "tab:red", "mwms": "tab:blue", "ceiling": "tab:green"}
    keys = list(summaries)
    fig, ax = plt.subplots(figsize=(8, 5))
    keras, mwms = summaries.get("keras"), summaries.get("mwms")
    targets = []
    if keras is not None and keras.status == "ok":
        targets.append((keras.samples_s * SPEEDUP_VS_KERAS, "tab:gray", f"{SPEEDUP_VS_KERAS:.1f}x plain Keras"))
    if mwms is not None and mwms.status == "ok":
        targets.append((mwms.samples_s * SPEEDUP_VS_MWMS, "tab:blue", f"{SPEEDUP_VS_MWMS:.1f}x MWMS"))
    ok = [s for s in summaries.values() if s.status == "ok"]
    top = max([s.samples_s_max for s in ok] + [t[0] for t in targets], default=1.0)
    for i, key in enumerate(keys):
        summary = summaries[key]
        if summary.status != "ok":
            ax.text(i, top * 0.02, summary.status, ha="center", va="bottom", rotation=90, color="0.4")
            continue
        low = summary.samples_s - summary.samples_s_min
        high = summary.samples_s_max - summary.samples_s
        ax.bar(i, summary.samples_s, color=colors[key], yerr=[[low], [high]], capsize=6)
        label = f"{summary.samples_s:,.0f}"
        for name, base in (("Keras", keras), ("MWMS", mwms), ("ceiling", summaries.get("ceiling"))):
            versus = ratio(summary, base)
            if versus is not None and base is not summary and (name == "Keras" or key == "tnt2"):
                label += f"\n{versus:.2f}x {name}"
        ax.text(i, summary.samples_s_max + top * 0.01, label, ha="center", va="bottom", fontsize=9)
    for value, color, text in targets:
        ax.axhline(value, color=color, linestyle="--", linewidth=1, label=f"target for tnt 2 ranks: {text}")
    if targets:
        ax.legend(loc="upper left", fontsize=9)
    ax.set_xticks(range(len(keys)), [BY_KEY[k].label.replace(", ", ",\n", 1) for k in keys])
    ax.set_ylabel("global samples/s (median; bars: min-max over rounds)")
    ax.set_ylim(0, top * 1.3)
    ax.grid(True, axis="y", alpha=0.3)
    versions = {}
    for summary in summaries.values():
        versions.update(summary.versions)
    heading = (
        f"LeNet-5, global batch {args.batch}, SGD, {cpus()} CPU cores; "
        f"{args.passes} pass(es) x {args.rounds} rounds x {args.steps} steps\n"
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
    )
    busiest = max((s.other_load or 0.0 for s in ok), default=0.0)
    if busiest > BUSY_OTHER_LOAD:
        heading += f"\nmachine busy with other work (up to {busiest:.2f} cores, median per config): noisy"
    ax.set_title(heading, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return True


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(BY_KEY),
        default=list(BY_KEY),
        help="configurations to run (default: all): keras, tnt1, tnt2, mwms, ceiling",
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=2,
        help="start every configuration this many times, alternating; all rounds count (default: 2)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (epochs) per start (default: 5)")
    parser.add_argument(
        "--steps", type=int, default=100, help="steps per round; the warm-up is one more such epoch (default: 100)"
    )
    parser.add_argument("--batch", type=int, default=256, help="global batch size (default: 256)")
    parser.add_argument(
        "--samples", type=int, default=4096, help="synthetic samples, cached and repeated (default: 4096)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="seed of data and weights (default: 1234)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 pass, 2 rounds of 20 steps (about a minute)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="stop a configuration that finishes no epoch for this many seconds (default: 120)",
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "training.png", help="PNG plot (default: docs/training.png)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write all numbers to this JSON file")
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="run nothing: print the tables and draw the plot from a file written by --json",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.passes, args.rounds, args.steps = 1, 2, 20
    if min(args.passes, args.rounds, args.steps, args.batch, args.samples) < 1:
        parser.error("--passes, --rounds, --steps, --batch and --samples must be positive")
    if args.samples < args.batch:
        parser.error("--samples must be at least --batch")
    return args


def run_all(args: argparse.Namespace) -> dict[str, list[Run]]:
    """Pass by pass, one configuration after the other; the order rotates between passes so that
    none always runs first (or last) on a machine whose speed drifts."""
    keys = [c.key for c in CONFIGS if c.key in args.configs]
    results: dict[str, list[Run]] = {key: [] for key in keys}
    for pass_ in range(args.passes):
        shift = pass_ % len(keys)
        for key in keys[shift:] + keys[:shift]:
            done = results[key]
            if done and done[-1].status != "ok":
                continue  # not installed, failed or hung once: not tried again
            print(f"[pass {pass_ + 1}/{args.passes}] {BY_KEY[key].label} ...", end=" ", file=sys.stderr, flush=True)
            run = run_config(BY_KEY[key], args)
            done.append(run)
            note = ""
            if run.status == "ok":
                rates = [args.batch * args.steps / r["seconds"] for r in run.rounds]
                note = f", {statistics.median(rates):,.0f} samples/s"
            print(f"{run.status} ({run.wall_s:.1f} s{note})", file=sys.stderr, flush=True)
            if run.status not in ("ok", "not installed"):
                print(run.detail, file=sys.stderr, flush=True)
    return results


def from_json(args: argparse.Namespace) -> dict[str, Summary]:
    """The summaries a run saved with --json, under that run's settings (kept in ``args``)."""
    payload = json.loads(args.from_json.read_text())
    for key in ("passes", "rounds", "steps", "batch"):
        setattr(args, key, payload["settings"][key])
    return {key: Summary(**fields) for key, fields in payload["summaries"].items()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        summaries = from_json(args)
        print_tables(args, summaries)
        if plot(args, summaries, args.out):
            print(f"plot: {args.out}")
        return 0
    started = time.monotonic()
    with _ranks.terminate_as_interrupt():
        results = run_all(args)
    summaries = {key: summarise(BY_KEY[key], runs, args) for key, runs in results.items()}
    print_tables(args, summaries)
    busy = [BY_KEY[k].label for k, s in summaries.items() if (s.other_load or 0.0) > BUSY_OTHER_LOAD]
    if busy:
        print(
            f"note: other work kept more than {BUSY_OTHER_LOAD:.2f} cores busy (median) during the rounds of: "
            + ", ".join(busy)
            + "; those numbers are not comparable with a quiet machine's"
        )
    if plot(args, summaries, args.out):
        print(f"plot: {args.out}")
    if args.json:
        payload = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "summaries": {k: asdict(s) for k, s in summaries.items()},
            "checks": checks(summaries),
            "runs": {k: [asdict(r) for r in runs] for k, runs in results.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"numbers: {args.json}")
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; all workers were stopped", file=sys.stderr)
        sys.exit(130)
