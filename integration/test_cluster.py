"""Jobs on a cluster of network namespaces (``netns_cluster.py``): separate network stacks joined by
a bridge, one sshd per host, tnt-launch started on host 0. Collectives and Keras training across
hosts over tcp and over gpi2; the failures a cluster has that one machine has not are
test_cluster_failures.py's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cluster_jobs import PER_HOST, TRAIN, TRANSPORTS, env, launch_argv, transport_args
from netns_cluster import Cluster


def run_job(
    c: Cluster,
    hosts: int,
    transport: str,
    tmp_path: Path,
    code: str,
    timeout_s: int,
    wait_s: float,
    launcher_args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` on ``hosts`` hosts x PER_HOST ranks over ``transport``, every rank's output shown."""
    script = tmp_path / "job.py"
    script.write_text(code)
    args = (*transport_args(transport), "--output-on-all-devices", "--timeout", str(timeout_s), *launcher_args)
    args = (*args, "--", str(script))
    argv = launch_argv(c, hosts, tmp_path, *args)
    return subprocess.run(argv, env=env(c), capture_output=True, text=True, timeout=wait_s, check=False)


COLLECTIVES = r"""
import numpy as np, tnt_comm as tc

r, n = tc.rank(), tc.size()
local = int(__import__("os").environ["TNT_LOCAL_SIZE"])
gpi2 = __import__("os").environ["TNT_TRANSPORT"] == "gpi2"
kinds = tc.transports()
for peer, kind in enumerate(kinds):
    same_host = peer // local == r // local
    assert kind == ("self" if peer == r else "gpi2" if gpi2 else "shm" if same_host else "tcp"), (r, kinds)
for dtype in (np.float32, np.float64, np.int64):
    for count in (1, 1000, 3 << 20):  # up to 24 MiB of float64: many frames on every link
        x = (np.arange(count) % 97 + r).astype(dtype)
        want = (np.arange(count) % 97 * n + n * (n - 1) // 2).astype(dtype)
        assert np.array_equal(tc.allreduce(x), want), (r, dtype, count)
# The host-aware allreduce ran: in float32 1e8 + 1 == 1e8, so these values sum to 1 in rank order
# and to 0 when each host sums first (see packages/tnt-comm/tests/test_host_aware.py).
values = [1e8, 1.0, -1e8, 1.0] + [0.0] * (n - 4)
assert (tc.allreduce(np.full(100_000, values[r], np.float32)) == 0.0).all()
for root in range(n):
    b = np.full(5000, r, np.int64)
    tc.broadcast(b, root=root)
    assert (b == root).all(), (r, root)
assert tc.allgather(np.array([r, r * r])).tolist() == [[k, k * k] for k in range(n)]
print(f"OK rank {r} of {n}: {kinds}", flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("hosts", [2, 3])
def test_collectives_exact_across_hosts(cluster: Cluster, hosts: int, transport: str, tmp_path: Path) -> None:
    done = run_job(cluster, hosts, transport, tmp_path, COLLECTIVES, timeout_s=60, wait_s=150)
    assert done.returncode == 0, done.stdout + done.stderr
    n = hosts * PER_HOST
    for r in range(n):
        assert f"OK rank {r} of {n}" in done.stdout, done.stdout + done.stderr


@pytest.mark.timeout(400)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("hosts", [2, 3])
def test_keras_training_equals_serial_across_hosts(
    cluster: Cluster, hosts: int, transport: str, tmp_path: Path
) -> None:
    """2 and 3 hosts x 2 ranks train a global batch of 24 as one process does; the job's timeline
    shows the host-aware allreduce's phases on every rank."""
    trace = tmp_path / "trace.json"
    done = run_job(
        cluster, hosts, transport, tmp_path, TRAIN, timeout_s=120, wait_s=380, launcher_args=("--timeline", str(trace))
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert len(re.findall(r"RESULT rank \d diff", done.stdout)) == hosts * PER_HOST, done.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    for rank in range(hosts * PER_HOST):
        # Each collective's marks under its id: its begin (with args), then its phases, in order.
        marks: dict[str, list[dict]] = {}
        for e in events:
            if e.get("pid") == rank and e.get("cat") == "tnt-comm":
                marks.setdefault(e["id2"]["local"], []).append(e)
        host_aware = [m for m in marks.values() if m[0]["args"].get("algorithm") == "host-aware"]
        assert host_aware, (rank, [m[0]["args"] for m in marks.values()])
        for m in host_aware:
            begun = [(e["name"], e["ts"]) for e in m if e["ph"] == "b"]
            assert [name for name, _ in begun[3:]] == HOST_AWARE_PHASES, m
            ends = {e["name"]: e["ts"] for e in m if e["ph"] == "e"}
            times = [ts for _, ts in begun[2:]] + [ends["running"]]  # running, its phases, its end
            assert times == sorted(times), m


# The host-aware allreduce's parts, one after another on every rank (SGD's sum: no division).
HOST_AWARE_PHASES = ["reduce-scatter within the host", "ring across hosts", "allgather within the host"]
