"""`tnt-launch --timeline-summary FILE`: what a job's trace (`--timeline FILE`) says, per epoch and rank.

- **compute**: the time in training steps, less the time the rank was blocked on communication;
- **communication**: the time some collective of the rank was in flight (from submission to
  completion, overlaps counted once);
- **not hidden**: the part of a step in which communication held the rank up: blocked waiting on a
  non-blocking collective or inside a blocking one, and the step's tail from the submission of its
  last collective to the completion of the last (the gradients are all computed then, and the update
  waits for their sum: on TensorFlow, whose buckets complete through TensorFlow's executor, this tail
  is what there is to see).

It also draws one step of every rank (the middle step of the last epoch) into FILE's name with
`.step.png`, where matplotlib is installed.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

Interval = tuple[float, float]


@dataclass
class RankTrace:
    """One rank's events, in microseconds on rank 0's clock."""

    epochs: list[tuple[float, float, int]] = field(default_factory=list)
    steps: list[Interval] = field(default_factory=list)
    collectives: list[tuple[float, float, str, int, bool]] = field(default_factory=list)
    """(begin, end, name, bytes, blocking)"""
    waits: list[Interval] = field(default_factory=list)


@dataclass(frozen=True)
class EpochRow:
    rank: int
    epoch: int
    steps: int
    step_s: float
    compute_s: float
    communication_s: float
    not_hidden_s: float
    bytes: int


def load(path: str) -> dict[int, RankTrace]:
    """The trace at `path`, by rank; raises ValueError for a file that is not one of tnt's traces."""
    try:
        with open(path) as f:
            data = json.load(f)
        events = data["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a trace written by tnt-launch --timeline: {e}") from None
    ranks: dict[int, RankTrace] = defaultdict(RankTrace)
    open_ops: dict[tuple[int, str], tuple[float, dict[str, Any], str]] = {}
    for e in events:
        pid, ph, name = e.get("pid"), e.get("ph"), e.get("name")
        if not isinstance(pid, int) or ph == "M":
            continue
        trace = ranks[pid]
        if ph == "X":
            interval = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
            if name == "step":
                trace.steps.append(interval)
            elif name == "epoch":
                trace.epochs.append((*interval, int(e.get("args", {}).get("epoch", len(trace.epochs)))))
            elif name == "wait":
                trace.waits.append(interval)
        elif e.get("cat") == "tnt-comm":
            # A collective's own begin carries its args; its phases (queued, running, the
            # algorithm's parts) nest inside it under the same id, and its own end comes last.
            key = (pid, str(e.get("id2", {}).get("local", e.get("id"))))
            if ph == "b" and "bytes" in e.get("args", {}):
                open_ops[key] = (float(e["ts"]), e.get("args", {}), name)
            elif ph == "e" and key in open_ops and open_ops[key][2] == name:
                begin, args, op = open_ops.pop(key)
                trace.collectives.append(
                    (begin, float(e["ts"]), op, int(args.get("bytes", 0)), bool(args.get("blocking")))
                )
    return dict(sorted(ranks.items()))


def union(intervals: Sequence[Interval]) -> float:
    """The length of the union of `intervals`."""
    total, end = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        if finish <= end:
            continue
        total += finish - max(begin, end)
        end = finish
    return total


def _clip(intervals: Sequence[Interval], window: Interval) -> list[Interval]:
    low, high = window
    return [(max(b, low), min(e, high)) for b, e in intervals if e > low and b < high]


def summarize(ranks: dict[int, RankTrace]) -> list[EpochRow]:
    rows = []
    for rank, trace in ranks.items():
        for begin, end, epoch in sorted(trace.epochs):
            steps = _clip(trace.steps, (begin, end))
            step_s = sum(e - b for b, e in steps) / 1e6
            comm = _clip([(b, e) for b, e, *_ in trace.collectives], (begin, end))
            blocked = trace.waits + [(b, e) for b, e, _, _, blocking in trace.collectives if blocking]
            in_steps = []
            for step in steps:
                in_steps += _clip(blocked, step)
                inside = [(b, e) for b, e, *_ in trace.collectives if step[0] <= b < step[1]]
                if inside:
                    in_steps += _clip([(max(b for b, _ in inside), max(e for _, e in inside))], step)
            not_hidden = union(in_steps) / 1e6
            sent = sum(n for b, e, _, n, _ in trace.collectives if begin <= b < end)
            rows.append(EpochRow(rank, epoch, len(steps), step_s, max(0.0, step_s - not_hidden),
                                 union(comm) / 1e6, not_hidden, sent))
    return rows


def print_table(rows: Sequence[EpochRow], out: TextIO) -> None:
    out.write(f"{'rank':>4} {'epoch':>5} {'steps':>5} {'step s':>8} {'compute s':>9} {'comm s':>8} "
              f"{'not hidden s':>12} {'MB reduced':>10}\n")
    out.writelines(f"{r.rank:>4} {r.epoch:>5} {r.steps:>5} {r.step_s:>8.3f} {r.compute_s:>9.3f} "
                  f"{r.communication_s:>8.3f} {r.not_hidden_s:>12.3f} {r.bytes / 1e6:>10.2f}\n" for r in rows)


def plot_step(ranks: dict[int, RankTrace], png: str) -> str | None:
    """Draws the middle step of the last epoch of every rank; returns why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib)"
    first = next(iter(ranks.values()))
    if not first.steps:
        return "the trace has no training steps"
    steps = sorted(first.steps)
    if first.epochs:
        last = max(first.epochs)
        steps = [s for s in steps if last[0] <= s[0] < last[1]] or steps
    window = steps[len(steps) // 2]
    origin = window[0]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * len(ranks)))
    for row, (rank, trace) in enumerate(ranks.items()):
        y = len(ranks) - 1 - row
        for b, e in _clip(trace.steps, window):
            ax.barh(y + 0.25, (e - b) / 1e3, left=(b - origin) / 1e3, height=0.2, color="#4c72b0")
        for b, e, *_ in trace.collectives:
            for cb, ce in _clip([(b, e)], window):
                ax.barh(y, (ce - cb) / 1e3, left=(cb - origin) / 1e3, height=0.2, color="#dd8452", alpha=0.6)
        for b, e in _clip(trace.waits, window):
            ax.barh(y - 0.25, (e - b) / 1e3, left=(b - origin) / 1e3, height=0.2, color="#c44e52")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in reversed(list(ranks))])
    ax.set_xlabel("ms from the step's start on rank 0 (blue: step, orange: collectives, red: blocked waiting)")
    ax.set_title("one training step")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return None


def main(argv: Sequence[str]) -> int:
    """`tnt-launch --timeline-summary FILE`."""
    if len(argv) != 1:
        print("usage: tnt-launch --timeline-summary FILE", file=sys.stderr)
        return 2
    path = argv[0]
    try:
        ranks = load(path)
    except ValueError as e:
        print(f"tnt-launch: error: {e}", file=sys.stderr)
        return 1
    rows = summarize(ranks)
    if not rows:
        print(f"tnt-launch: {path} holds no epoch of training (was fit called?)", file=sys.stderr)
        return 1
    print_table(rows, sys.stdout)
    png = os.path.splitext(path)[0] + ".step.png"
    why = plot_step(ranks, png)
    print(f"one step: {png}" if why is None else f"no picture of a step: {why}")
    return 0
