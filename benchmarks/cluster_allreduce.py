"""Allreduce across hosts with real link limits: tnt host-aware and flat over tcp and gpi2, and Gloo, in one run.

Builds a cluster of network namespaces (``integration/netns_cluster.py``; needs root): HOSTS hosts,
each with one veth link shaped by ``tc`` (default 1 Gbit/s each way; ``--delay`` adds netem's
delay, on kernels that have it), and starts
PER_HOST ranks on each with tnt-launch. Every library runs ``_worker.py`` (the same worker as
``allreduce.py``), alternating, PASSES times; the time of an iteration is the slowest rank's, and
each library's figure is the median over all its iterations.

busbw is counted over hosts, since the host links are the bottleneck: ``S / t * 2(H-1)/H`` for H
hosts, which is at most the link rate (each host must send and receive ``2(H-1)/H * S`` whatever
the algorithm). The flat algorithm sends ``2(n-1)/n * S`` per rank, PER_HOST times over each link;
a ring (Gloo) crosses each host boundary once per direction, ``2(n-1)/n * S`` per link.

    python benchmarks/cluster_allreduce.py [--hosts 4 --per-host 2 --rate 1gbit] [--delay 50us]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from netns_cluster import Cluster, ClusterUnavailable, up  # noqa: E402

CONFIGS = {  # name: (worker library, variables for every rank)
    "tnt host-aware": ("tnt", {}),
    "tnt flat": ("tnt", {"TNT_ALLREDUCE": "flat"}),
    # GPI-2 (its Ethernet device) for every pair, hosts' own ranks included; needs a GPI-2 build.
    "tnt host-aware gpi2": ("tnt", {"TNT_TRANSPORT": "gpi2"}),
    "tnt flat gpi2": ("tnt", {"TNT_TRANSPORT": "gpi2", "TNT_ALLREDUCE": "flat"}),
    "Gloo": ("gloo", {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}),
}
ITERS = {16 << 10: (100, 10), 64 << 10: (60, 5), 1 << 20: (20, 2), 16 << 20: (6, 1), 64 << 20: (4, 1)}
# bytes: (timed iterations, warm-up) per pass; other sizes get ITERS_DEFAULT
ITERS_DEFAULT = (5, 1)


def parse_size(text: str) -> int:
    """'16K' -> 16384, '1M' -> 1048576 (binary units; a bare number is MiB, as before)."""
    m = re.fullmatch(r"(\d+)([KkMm]?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}: give it as 16K, 1M or 64M")
    return int(m.group(1)) << (10 if m.group(2).upper() == "K" else 20)


def label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def rate_bytes(rate: str) -> float:
    """'1gbit' -> 125e6 bytes/s (tc's units: bit, kbit, mbit, gbit; decimal)."""
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", rate.lower())
    if not m:
        raise SystemExit(f"--rate {rate!r}: give it as tc does, e.g. 1gbit or 500mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def run_config(
    cluster: Cluster, hosts: int, per_host: int, lib: str, env: dict[str, str], sizes: list[int], folder: Path
) -> dict[int, list[float]]:
    """One start of LIB on the cluster; seconds per iteration (slowest rank) for each size."""
    results = Path(tempfile.mkdtemp(dir=folder))
    plan = results / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "results": str(results),
                "sizes": [
                    {"bytes": s, "iters": ITERS.get(s, ITERS_DEFAULT)[0], "warmup": ITERS.get(s, ITERS_DEFAULT)[1]}
                    for s in sizes
                ],
            }
        )
    )
    hostfile = results / "hostfile"
    hostfile.write_text("".join(f"{cluster.address(i)} slots={per_host}\n" for i in range(hosts)))
    exports = [arg for k, v in env.items() for arg in ("-x", f"{k}={v}")]
    argv = [
        sys.executable,
        "-m",
        "tnt_launch",
        "--hostfile",
        str(hostfile),
        "--ssh-port",
        "22",
        "--no-gpu",
        "--timeout",
        "600",
        *exports,
        "--",
        sys.executable,
        str(HERE / "_worker.py"),
        lib,
        str(plan),
    ]
    done = subprocess.run(
        cluster.command(0, argv),
        env=dict(os.environ, TNT_SSH_OPTS=cluster.ssh_options),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{lib} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    per_rank = []
    for path in sorted(results.glob(f"{lib}.r*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        per_rank.append({r["size"]: r for r in records if "size" in r})
    times: dict[int, list[float]] = {}
    for s in sizes:
        rows = [rank[s] for rank in per_rank]
        for row in rows:
            if "error" in row:
                raise RuntimeError(f"{lib} at {label(s)}: {row['error']}")
        times[s] = [max(ns) / 1e9 for ns in zip(*(row["ns"] for row in rows), strict=True)]
    shutil.rmtree(results, ignore_errors=True)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="link rate of every host, as tc takes it")
    parser.add_argument("--delay", help="one-way delay of every link, as tc takes it (needs sch_netem)")
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", default=[16 << 10, 1 << 20, 16 << 20, 64 << 20], help="16K, 1M, 64M..."
    )
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--env", nargs="+", default=[], metavar="KEY=VALUE", help="more variables for every rank")
    parser.add_argument("--out", type=Path, help="write a PNG plot here (e.g. docs/cluster_allreduce.png)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args()
    link = rate_bytes(args.rate)
    if any("gpi2" in c for c in args.configs):
        import tnt_comm

        if "gpi2" not in tnt_comm.build_info()["transports"]:
            print("cluster_allreduce: this tnt_comm has no GPI-2: leaving out the gpi2 configurations "
                  "(build it with GPI2_ROOT set, docs/comm.md)", file=sys.stderr)
            args.configs = [c for c in args.configs if "gpi2" not in c]
    try:
        cluster = up(args.hosts, rate=args.rate, delay=args.delay)
    except ClusterUnavailable as e:
        print(f"cluster_allreduce: cannot build the cluster: {e}", file=sys.stderr)
        return 2
    started = time.monotonic()
    times: dict[str, dict[int, list[float]]] = {c: {s: [] for s in args.sizes} for c in args.configs}
    try:
        with tempfile.TemporaryDirectory(prefix="tnt-cluster-bench-") as folder:
            for p in range(args.passes):
                for name in args.configs:
                    lib, env = CONFIGS[name]
                    env = {**env, **dict(kv.split("=", 1) for kv in args.env)}
                    print(f"pass {p + 1}/{args.passes}: {name} ...", flush=True)
                    for s, ts in run_config(
                        cluster, args.hosts, args.per_host, lib, env, args.sizes, Path(folder)
                    ).items():
                        times[name][s].extend(ts)
    finally:
        cluster.down()
    h = args.hosts
    factor = 2 * (h - 1) / h
    shaping = f"{args.rate} + {args.delay} delay (netem)" if args.delay else f"{args.rate} (tbf), no added delay"
    title = (
        f"allreduce float32 sum, {h} hosts x {args.per_host} ranks, links {shaping} each way; "
        f"busbw over hosts = S / t x 2(H-1)/H; link rate {link / 1e6:.0f} MB/s"
    )
    print(title)
    header = ["size", *[f"{c} (ms, MB/s, % link)" for c in args.configs]]
    rows = []
    summary: dict[str, dict[int, float]] = {c: {} for c in args.configs}
    for s in args.sizes:
        cells = [label(s)]
        for c in args.configs:
            t = statistics.median(times[c][s])
            busbw = s / t * factor
            summary[c][s] = busbw
            cells.append(f"{t * 1e3:8.1f} ms {busbw / 1e6:6.1f} MB/s {100 * busbw / link:4.0f}%")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))
    if "tnt host-aware" in summary:
        for other in ("tnt flat", "Gloo", "tnt host-aware gpi2"):
            if other in summary:
                ratios = ", ".join(
                    f"{label(s)} {summary['tnt host-aware'][s] / summary[other][s]:.2f}x" for s in args.sizes
                )
                print(f"host-aware / {other} busbw: {ratios}")
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "title": title,
                    "link_bytes_s": link,
                    "times": {c: {str(s): v for s, v in d.items()} for c, d in times.items()},
                },
                indent=1,
            )
        )
    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for c in args.configs:
            ax.plot(args.sizes, [summary[c][s] / 1e6 for s in args.sizes], marker="o", label=c)
        ax.axhline(link / 1e6, color="gray", linestyle="--", label=f"link rate ({args.rate})")
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.sizes, [label(s) for s in args.sizes])
        ax.set_ylabel("busbw over hosts (MB/s)")
        ax.set_title(f"allreduce, {h} hosts x {args.per_host} ranks, {args.rate} links", fontsize=10)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"plot: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
