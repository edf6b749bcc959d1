"""`tnt-launch --timeline FILE` on 2 real ranks, on both backends: one trace of the job, in Chrome's
trace-event JSON, with every rank's steps, epochs, broadcast, save and collectives (the gradient
buckets with their bytes), on one clock; and the summary `tnt-launch --timeline-summary` reads
from it."""

import json
import subprocess
from pathlib import Path

import pytest
from conftest import skip_unless_installed
from launch import run
from tnt_launch import timeline_summary

CLOCK_SHIFT_S = 1000


def clocks_can_shift() -> bool:
    """Whether this machine gives a process a monotonic clock of its own (a time namespace, Linux
    5.6, and the right to make one)."""
    try:
        probe = subprocess.run(["unshare", "--time", "--monotonic=1", "true"], capture_output=True, check=False)
    except OSError:
        return False
    return probe.returncode == 0


def spans(events: list[dict], rank: int, name: str) -> list[dict]:
    return [e for e in events if e.get("pid") == rank and e.get("name") == name and e["ph"] in ("X", "b")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_a_trace_of_both_ranks_steps_and_collectives(backend: str, tmp_path: Path) -> None:
    if backend == "torch":
        skip_unless_installed("torch")
    trace, second = tmp_path / "trace.json", tmp_path / "second.json"
    # Where it can, rank 1 reads a clock 1000 s ahead of rank 0's, as a rank on another host does;
    # elsewhere both read one clock, and the check of alignment below is weaker.
    shifted = clocks_can_shift()
    env = {"TNT_TEST_CLOCK_SHIFT_S": str(CLOCK_SHIFT_S)} if shifted else {}
    result = run("timeline_job", 2, str(second), launcher_args=("--timeline", str(trace)), backend=backend,
                 timeout=280, env=env)
    if shifted:  # the shift took: rank 1's clock is ahead by it (the ranks report within seconds)
        apart = result.ranks[1]["monotonic_s"] - result.ranks[0]["monotonic_s"]
        assert abs(apart - CLOCK_SHIFT_S) < CLOCK_SHIFT_S / 10, apart
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        assert len(spans(events, rank, "step")) == 2 * 3  # 96 rows in global batches of 32, 2 epochs
        assert [e["args"]["epoch"] for e in spans(events, rank, "epoch")] == [0, 1]
        assert len(spans(events, rank, "broadcast of rank 0's variables")) == 1
        saves = [e["args"]["doing"] for e in spans(events, rank, "save")]
        assert len(saves) == 1 and saves[0].startswith("save weights to") and saves[0].endswith("m.weights.h5'")
        reduced = [e["args"]["bytes"] for e in spans(events, rank, "allreduce")]
        # 2 ranks on one host: small buckets take the one-shot algorithm, larger ones the direct.
        assert {e["args"]["algorithm"] for e in spans(events, rank, "allreduce")} <= {"one-shot", "direct"}
        assert max(reduced) >= (6 * 16 + 16 + 16 * 3 + 3) * 4  # the gradients, in one bucket or more
        # Every collective's phases lie within it, in order: queued, then running.
        by_id: dict[str, list[tuple[str, str, float]]] = {}
        for e in events:
            if e.get("pid") == rank and e.get("cat") == "tnt-comm":
                by_id.setdefault(e["id2"]["local"], []).append((e["name"], e["ph"], e["ts"]))
        for marks in by_id.values():
            times = [ts for _, _, ts in marks]
            assert [(n, ph) for n, ph, _ in marks][1:4] == [("queued", "b"), ("queued", "e"), ("running", "b")], marks
            assert [(n, ph) for n, ph, _ in marks][-2:] == [("running", "e"), (marks[0][0], "e")], marks
            assert times == sorted(times), marks
    steps = {rank: sorted(e["ts"] for e in spans(events, rank, "step")) for rank in (0, 1)}
    # One clock: the ranks' steps meet in every allreduce, so they start within a step of each other.
    longest = max(e["dur"] for e in events if e.get("name") == "step")
    assert all(abs(a - b) <= longest for a, b in zip(steps[0], steps[1], strict=True)), steps
    rows = timeline_summary.summarize(timeline_summary.load(str(trace)))
    assert [(r.rank, r.epoch, r.steps) for r in rows] == [(0, 0, 3), (0, 1, 3), (1, 0, 3), (1, 1, 3)]
    for r in rows:
        assert 0 < r.compute_s <= r.step_s and 0 <= r.not_hidden_s <= r.step_s and r.communication_s > 0
    # The Python API wrote its own trace: one epoch, and nothing of the first.
    again = json.loads(second.read_text())["traceEvents"]
    assert [e["args"]["epoch"] for e in spans(again, 0, "epoch")] == [0]
    assert not spans(again, 0, "save")
    # The third, whose folder never existed: rank 0 warned at the end of fit, after the save and at
    # stop(), and the job went on (run() checks it ended well) and saved.
    third = result.out_dir / "gone" / "third.json"
    warned = [ln for ln in result.output.splitlines() if f"could not write the timeline to {third}" in ln]
    assert len(warned) == 3 and all(ln.startswith("[tnt WARNING rank 0] ") for ln in warned), result.output[-3000:]
    assert (result.out_dir / "after.weights.h5").exists()
