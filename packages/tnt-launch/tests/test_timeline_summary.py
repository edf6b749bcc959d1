"""`tnt-launch --timeline` and `--timeline-summary`: the variable every rank gets, and what the summary
reads from a trace (a made-up one here, whose numbers are known; tnt-keras' tests summarize real ones)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tnt_launch import cli, timeline_summary
from tnt_launch.cli import parse_args
from tnt_launch.hosts import Host
from tnt_launch.plan import HostFacts, JobIdentity, build_plan


def test_every_rank_is_told_where_the_trace_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    config = parse_args(["-n", "2", "--timeline", "out/trace.json", "--", "train.py"], {})
    assert config.timeline == os.path.join(str(tmp_path), "out/trace.json")
    plan = build_plan(config, [Host("localhost", local=True)], {"localhost": HostFacts(cpus=2)},
                      JobIdentity("j", "t", 1234), {})
    assert {spec.env["TNT_TIMELINE"] for spec in plan.ranks} == {config.timeline}
    without = parse_args(["-n", "2", "--", "train.py"], {})
    plan = build_plan(without, [Host("localhost", local=True)], {"localhost": HostFacts(cpus=2)},
                      JobIdentity("j", "t", 1234), {})
    assert all("TNT_TIMELINE" not in spec.env for spec in plan.ranks)


def _op(rank: int, i: int, begin: float, end: float, blocking: bool = False, nbytes: int = 1000) -> list[dict]:
    common = {"cat": "tnt-comm", "pid": rank, "tid": 3, "id2": {"local": str(i)}}
    args = {"bytes": nbytes, "blocking": blocking}
    return [
        {**common, "ph": "b", "name": "allreduce", "ts": begin, "args": args},
        {**common, "ph": "b", "name": "queued", "ts": begin},
        {**common, "ph": "e", "name": "queued", "ts": begin},
        {**common, "ph": "b", "name": "running", "ts": begin},
        # The algorithm's phases nest in "running", under the collective's id, without args.
        {**common, "ph": "b", "name": "reduce-scatter within the host", "ts": begin},
        {**common, "ph": "e", "name": "reduce-scatter within the host", "ts": (begin + end) / 2},
        {**common, "ph": "b", "name": "ring across hosts", "ts": (begin + end) / 2},
        {**common, "ph": "e", "name": "ring across hosts", "ts": end},
        {**common, "ph": "e", "name": "running", "ts": end},
        {**common, "ph": "e", "name": "allreduce", "ts": end},
    ]


def _x(rank: int, name: str, begin: float, end: float, **args: object) -> dict:
    return {"ph": "X", "name": name, "pid": rank, "tid": 1, "ts": begin, "dur": end - begin, "args": args}


def test_the_summary_splits_steps_into_compute_and_exposed_communication(tmp_path: Path) -> None:
    # Rank 0, one epoch of two steps of 1 s (times in microseconds). Step 1: buckets in flight over
    # [0.2, 0.6] and [0.5, 0.9] s; the last is submitted at 0.5 and ends at 0.9, so 0.4 s is exposed.
    # Step 2: a blocking allreduce over [1.1, 1.2] s and a wait over [1.15, 1.3] s: 0.2 s exposed.
    events = [
        _x(0, "epoch", 0, 2e6, epoch=0),
        _x(0, "step", 0, 1e6, epoch=0, batch=0),
        _x(0, "step", 1e6, 2e6, epoch=0, batch=1),
        *_op(0, 0, 0.2e6, 0.6e6),
        *_op(0, 1, 0.5e6, 0.9e6, nbytes=3_000_000),
        *_op(0, 2, 1.1e6, 1.2e6, blocking=True),
        {"ph": "X", "name": "wait", "cat": "wait", "pid": 0, "tid": 2, "ts": 1.15e6, "dur": 0.15e6},
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    (row,) = timeline_summary.summarize(timeline_summary.load(str(trace)))
    assert (row.rank, row.epoch, row.steps) == (0, 0, 2)
    assert row.step_s == pytest.approx(2.0)
    assert row.communication_s == pytest.approx(0.7 + 0.1)  # [0.2, 0.9] and [1.1, 1.2]
    assert row.not_hidden_s == pytest.approx(0.4 + 0.2)  # [0.5, 0.9] and [1.1, 1.3]
    assert row.compute_s == pytest.approx(2.0 - 0.6)
    assert row.bytes == 3_002_000


def test_the_summary_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [_x(0, "epoch", 0, 1e6, epoch=0), _x(0, "step", 0, 1e6)]}))
    assert cli.main(["--timeline-summary", str(trace)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:4] == ["0", "0", "1", "1.000"]
    (tmp_path / "bad.json").write_text("{")
    assert cli.main(["--timeline-summary", str(tmp_path / "bad.json")]) == 1
    assert "is not a trace written by tnt-launch --timeline" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    assert cli.main(["--timeline-summary", str(empty)]) == 1
    assert "holds no epoch of training" in capsys.readouterr().err
