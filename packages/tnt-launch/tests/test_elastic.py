"""tnt-launch --elastic: a lost rank does not end the job while MIN ranks are left. Real ranks are
killed (SIGKILL) in a real job; the survivors re-form it at the store tnt-launch holds, finish their
program (each call checked exactly) and tnt-launch exits 0 saying who was lost. Fewer than MIN left
ends the job as a failure does today, with nothing left behind. The store (tnt_launch/store.py) is
also tried with hostile connections."""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from pathlib import Path

import pytest
from conftest import Launcher, assert_job_gone

tnt_comm = pytest.importorskip("tnt_comm", reason="elastic jobs need tnt_comm's ranks")
RANK = str(Path(__file__).resolve().parent / "elastic_rank.py")


def job_id_of(stderr: str) -> str:
    found = re.search(r"job ([0-9a-f]{12})", stderr)
    assert found, stderr
    return found.group(1)


NO_GPI2 = pytest.mark.skipif("gpi2" not in tnt_comm.build_info()["transports"],
                             reason="this tnt_comm has no GPI-2 transport: build it with GPI2_ROOT set (docs/comm.md)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("victims", "transport"),
                         [([2], "auto"), ([0], "tcp"), ([1, 3], "auto"), pytest.param([1], "gpi2", marks=NO_GPI2)],
                         ids=["rank-2", "rank-0-tcp", "two-at-once", "rank-1-gpi2"])
def test_the_job_goes_on_without_lost_ranks(victims: list[int], transport: str, launcher: Launcher,
                                             tmp_path: Path) -> None:
    done = launcher.run(["-n", "4", "--no-gpu", "--elastic", "2", "--transport", transport, "--timeout", "30",
                         "--", RANK, str(tmp_path), "--kill", *map(str, victims), "--at", "7"], timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    survivors = [m for m in range(4) if m not in victims]
    reports = [json.loads((tmp_path / f"member-{m}.json").read_text()) for m in survivors]
    for report in reports:
        assert report["members"] == survivors and report["steps"] == 30 and report["size"] == len(survivors)
        # GPI-2 starts once per process: a job that began over it goes on over shared memory.
        assert report["first"] == [{"gpi2": "gpi2", "tcp": "tcp"}.get(transport, "shm")], report
        assert report["last"] == ["tcp" if transport == "tcp" else "shm"], report
    for victim in victims:
        assert f"rank {victim} (host localhost, local rank {victim}) is lost: it was killed by signal 9" in done.stderr
    assert f"finished on {len(survivors)} rank(s); lost on the way: " in done.stderr, done.stderr
    # Rank 0's output is shown, and only its: once rank 0 is lost, the survivor that took its place.
    assert re.findall(r"rank 0 of generation \d+ is member \d+", done.stdout) == [
        f"rank 0 of generation {reports[0]['generation']} is member {survivors[0]}"], done.stdout
    assert_job_gone(job_id_of(done.stderr))


@pytest.mark.timeout(120)
def test_fewer_than_min_left_fails_the_job(launcher: Launcher, tmp_path: Path) -> None:
    done = launcher.run(["-n", "4", "--no-gpu", "--elastic", "3", "--timeout", "30",
                         "--", RANK, str(tmp_path), "--kill", "1", "2", "--at", "4"], timeout=100)
    assert done.returncode != 0
    assert "job" in done.stderr and "failed" in done.stderr, done.stderr[-3000:]
    assert "rank 1" in done.stderr or "rank 2" in done.stderr
    assert not list(tmp_path.glob("member-*.json"))
    assert_job_gone(job_id_of(done.stderr))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--elastic", "0"], "1 <= MIN <= MAX"),
        (["--elastic", "3:2"], "1 <= MIN <= MAX"),
        (["--elastic", "2:x"], "1 <= MIN <= MAX"),
        (["--elastic", "2:3"], "MAX is below the 4 ranks"),
        (["--elastic", "5"], "more ranks than -n 4"),
        (["--elastic", "2", "--max-restarts", "2"], "give a MAX"),
    ],
)
def test_elastic_usage_errors(args: list[str], says: str, launcher: Launcher) -> None:
    done = launcher.run(["-n", "4", *args, "--", RANK, "."], timeout=30)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _request(sock: socket.socket, op: bytes, key: bytes, value: bytes = b"") -> bytes:
    sock.sendall(op + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value)
    (length,) = struct.unpack("<I", sock.recv(4, socket.MSG_WAITALL))
    return sock.recv(length, socket.MSG_WAITALL) if length else b""


def test_the_store_serves_its_job_and_nobody_else() -> None:
    from tnt_launch.store import MAX_STRANGERS, ElasticStore

    store = ElasticStore("127.0.0.1", 0, "secret", "job1")
    try:
        # A wrong token is answered and dropped; garbage is dropped at once.
        wrong = _connect(store.port)
        wrong.sendall(b"TNT1" + struct.pack("<I", 5) + b"wrong")
        assert wrong.recv(1) == b"R" and wrong.recv(1) == b""
        garbage = _connect(store.port)
        garbage.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert garbage.recv(1) == b""
        # Strangers that say nothing hold a bounded number of places for a bounded time (the
        # clients of tnt-comm retry their connection meanwhile).
        idle = [_connect(store.port) for _ in range(MAX_STRANGERS + 8)]
        time.sleep(2.5)
        client = _connect(store.port)
        client.sendall(b"TNT1" + struct.pack("<I", 6) + b"secret")
        assert client.recv(1) == b"K"
        assert _request(client, b"C", b"k", b"first") == b"first"
        assert _request(client, b"C", b"k", b"second") == b"first"  # a claim keeps the first value
        assert _request(client, b"A", b"n", b"5") == b"5" and _request(client, b"A", b"n", b"-2") == b"3"
        assert _request(client, b"T", b"none") == b"0" and _request(client, b"T", b"k") == b"1first"
        store.mark_lost(3, "killed")
        deadline = time.monotonic() + 5
        while _request(client, b"T", b"job1/elastic/lost/3") != b"1killed":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # A request larger than the limit is refused with a reason, and the connection dropped.
        client.sendall(b"S" + struct.pack("<I", (1 << 20) + 1))
        (refused,) = struct.unpack("<I", client.recv(4, socket.MSG_WAITALL))
        assert refused == 0xFFFFFFFF
        for s in [*idle, garbage, wrong, client]:
            s.close()
    finally:
        store.close()


def test_a_replacement_admitted_later_in_a_batch_of_decisions_is_not_left_out() -> None:
    """The sequence a loaded run of two replacements had (integration, spare host): generation 1 drops
    ranks 2 and 3; replacement 5 is admitted alone (generation 2), replacement 4 next (generation 3),
    both decisions read in one batch. Rank 4 is no more left out of generation 2 than it was a member
    of it; a later generation without it does leave it out."""
    from tnt_launch.store import ElasticStore
    from tnt_launch.supervise import left_out_of

    store = ElasticStore("127.0.0.1", 0, "secret", "job1")
    try:
        client = _connect(store.port)
        client.sendall(b"TNT1" + struct.pack("<I", 6) + b"secret")
        assert client.recv(1) == b"K"
        steps = [(b"g0/next", b"0:0,1:0"), (b"g1/next", b"0:0,1:0,5:2"), (b"admitted/5", b"2"),
                 (b"g2/next", b"0:0,1:0,5:2,4:2"), (b"admitted/4", b"3")]
        for name, value in steps:
            _request(client, b"C" if name.endswith(b"/next") else b"S", b"job1/elastic/" + name, value)
        deadline = time.monotonic() + 5
        decisions: list[tuple[int, list[int]]] = []
        while len(decisions) < 3:
            assert time.monotonic() < deadline, decisions
            decisions += store.take_decisions()
            time.sleep(0.01)
        assert decisions == [(1, [0, 1]), (2, [0, 1, 5]), (3, [0, 1, 5, 4])]
        joiners = {4: store.admitted_in(4), 5: store.admitted_in(5), 6: store.admitted_in(6)}
        assert joiners == {4: 3, 5: 2, 6: None}
        running = [0, 1, 2, 3, 4, 5, 6]
        assert [left_out_of(g, members, running, joiners) for g, members in decisions] == [[2, 3]] * 3
        assert left_out_of(4, [0, 1, 5], running, joiners) == [2, 3, 4]  # replacement 4 lost later
        client.close()
    finally:
        store.close()
