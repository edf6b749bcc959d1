"""Strangers on loopback must not stall the rendezvous: idle or garbage connections to the store
and to the peer listeners, oversized requests from an authenticated client, and a flood of
connections to rank 0 under a low file limit. Every job below must still start and be exact."""

from __future__ import annotations

import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from ranks import Job, Result, free_port

psutil = pytest.importorskip("psutil")

# What the library promises: a stranger gets about 2 s to present a hello. The bounds below are
# generous multiples of it, or of the 5 s each stranger used to cost when hellos were serial.
HELLO_S = 2.0
OLD_COST_S = 5.0
IDLE = 8

PEER_MAGIC = 0x544E5448  # "TNTH" as the peer hello's little-endian u32

# Rank 0 starts at once and waits in the rendezvous; the others wait for the test's go-file, so the
# test can attack rank 0's ports first. Every rank prints how long its start and allreduce took.
RANK_CODE = """
import os, time
from pathlib import Path
LIMIT
import numpy as np, tnt_comm as tc
if os.environ["TNT_RANK"] != "0":
    go = Path(os.environ["GO_FILE"])
    while not go.exists():
        time.sleep(0.05)
t = time.monotonic()
tc.init()
y = tc.allreduce(np.full(1000, tc.rank() + 1, np.float32))
print("OK", round(time.monotonic() - t, 2), float(y.min()), float(y.max()), flush=True)
"""

LOW_LIMIT = """
import resource
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if os.environ["TNT_RANK"] == "0":
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
"""


# Rank 0 also fills its table up to 24 free descriptors: fewer than strangers may take, so a flood
# runs it out of descriptors (EMFILE) while it waits in the rendezvous.
NEARLY_FULL = """
if os.environ["TNT_RANK"] == "0":
    import numpy
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(256 - 24 - len(os.listdir("/proc/self/fd")))]
"""


def rank_code(low_limit: bool = False, nearly_full: bool = False) -> str:
    return RANK_CODE.replace("LIMIT", (LOW_LIMIT if low_limit else "") + (NEARLY_FULL if nearly_full else ""))


def wait_for(what: str, check: Callable[[], bool], timeout: float, job: Job | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if job is not None and job.procs[0].poll() is not None:
            _, err = job.procs[0].communicate()
            pytest.fail(f"rank 0 exited {job.procs[0].returncode} while waiting for {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def listening_ports(pid: int) -> set[int]:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def rank0_ports(job: Job, store_port: int) -> tuple[int, int]:
    """Waits until rank 0 listens on the store port and on its peer port; returns both."""
    found: dict[str, int] = {}

    def ready() -> bool:
        ports = listening_ports(job.procs[0].pid)
        peer = ports - {store_port}
        if store_port in ports and peer:
            found["peer"] = min(peer)
            return True
        return False

    wait_for("rank 0's store and peer listeners", ready, 60, job)
    return store_port, found["peer"]


def connect(port: int, payload: bytes = b"") -> socket.socket | None:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
    except OSError:
        return None
    try:
        if payload:
            s.sendall(payload)
    except OSError:
        pass  # the listener dropped it already: still counts as closed below
    s.setblocking(False)
    return s


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the other end closed `s` (reading and discarding whatever it answered first)."""
    try:
        while True:
            if not s.recv(4096):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def garbage(token_len: int) -> list[bytes]:
    """Hellos that must be dropped: by the store, by a peer listener, or by both."""
    wrong = b"x" * token_len
    return [
        b"GET / HTTP/1.0\r\n\r\n",
        b"TN",  # a partial magic, then nothing: only the deadline ends it
        b"TNT1" + struct.pack("<I", token_len) + wrong,  # store hello, wrong token
        b"TNT1" + struct.pack("<I", 0xFFFFFFF0),  # store hello announcing a 4 GiB token
        b"TNT1" + struct.pack("<I", token_len),  # store hello that stops before its token
        struct.pack("<Ii", PEER_MAGIC, 1) + wrong,  # peer hello for rank 1, wrong token
        struct.pack("<Ii", PEER_MAGIC, 7),  # peer hello for a rank that does not exist
        struct.pack("<Ii", PEER_MAGIC, 1),  # peer hello for rank 1 that stops before its token
    ]


class Holder:
    """Keeps connections open to ports from a thread, reopening the ones the other end closes."""

    def __init__(self, payloads: Iterable[bytes], interval: float = 0.25) -> None:
        self.payloads = list(payloads)
        self.interval = interval
        self.targets: dict[int, int] = {}
        self.open: dict[int, list[socket.socket]] = {}
        self.opened = 0
        self.closed_by_server = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def hold(self, port: int, count: int) -> None:
        with self.lock:
            self.targets[port] = count
            self.open.setdefault(port, [])

    def __enter__(self) -> Holder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)
        for socks in self.open.values():
            for s in socks:
                s.close()

    def _run(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                targets = dict(self.targets)
            for port, count in targets.items():
                socks = self.open[port]
                alive = []
                for s in socks:
                    if closed_by_peer(s):
                        s.close()
                        self.closed_by_server += 1
                    else:
                        alive.append(s)
                while len(alive) < count and not self.stopping.is_set():
                    s = connect(port, self.payloads[self.opened % len(self.payloads)])
                    if s is None:
                        break  # not listening yet, or its queue is full: next round
                    alive.append(s)
                    self.opened += 1
                self.open[port] = alive
            self.stopping.wait(self.interval)


def store_client(port: int, token: str) -> socket.socket:
    """A connection to the store that presented the job token."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"TNT1" + struct.pack("<I", len(token)) + token.encode())
    assert s.recv(1) == b"K"
    return s


def read_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"closed after {out!r}"
        out += chunk
    return out


def try_get_missing(s: socket.socket) -> None:
    s.sendall(b"T" + struct.pack("<I", 4) + b"none" + struct.pack("<I", 0))
    assert read_exact(s, 4) == struct.pack("<I", 1) and read_exact(s, 1) == b"0"


def check_exact(results: list[Result], n: int) -> None:
    expected = float(sum(range(1, n + 1)))
    for res in results:
        assert res.returncode == 0, f"rank {res.rank} exited {res.returncode}:\n{res.stderr[-3000:]}"
        words = res.stdout.split()
        assert words[:1] == ["OK"] and float(words[2]) == float(words[3]) == expected, (res.rank, res.stdout)


def start_seconds(res: Result) -> float:
    return float(res.stdout.split()[1])


@pytest.mark.timeout(150)
def test_idle_and_garbage_connections_neither_linger_nor_delay_the_start(tmp_path: Path) -> None:
    store_port = free_port()
    go = tmp_path / "go"
    env = {"TNT_MASTER_PORT": str(store_port), "TNT_TIMEOUT_S": "90", "GO_FILE": str(go)}
    job = Job(2, rank_code(), tmp_path, env=env)
    strangers: dict[int, list[socket.socket | None]] = {}
    try:
        ports = rank0_ports(job, store_port)
        strangers = {p: [connect(p, g) for g in [b""] * IDLE + garbage(32)] for p in ports}
        assert all(s is not None for socks in strangers.values() for s in socks)
        # 1. The store closes its strangers on their own deadline, all of them side by side.
        #    (Rank 0 takes connections on its peer port only once every rank has published its
        #    address: until then they wait in the kernel's queue, costing rank 0 no descriptor.)
        wait_for(
            "the store to close every idle and garbage connection",
            lambda: all(closed_by_peer(s) for s in strangers[store_port]),  # type: ignore[arg-type]
            4 * HELLO_S + 5,
            job,
        )
        # 2. Rank 1 starts while the peer port's strangers still wait in its queue, ahead of rank 1,
        #    and fresh idle and garbage connections to both ports are kept up.
        with Holder([b""] * IDLE + garbage(32)) as holder:
            for p in ports:
                holder.hold(p, IDLE + len(garbage(32)))
            wait_for("the connections to be opened", lambda: holder.opened >= 2 * IDLE, 30, job)
            go.touch()
            results = job.wait(120)
        print("rank 1 start + allreduce:", start_seconds(results[1]), "s")
        check_exact(results, 2)
        # Rank 1's start did not wait for the strangers one after another.
        assert start_seconds(results[1]) < IDLE * OLD_COST_S / 2, results[1].stdout
    finally:
        job.kill()
        for socks in strangers.values():
            for s in socks:
                if s is not None:
                    s.close()
    assert not job.shm_leftovers()


@pytest.mark.timeout(120)
def test_authenticated_client_with_oversized_lengths_is_refused_clearly(tmp_path: Path) -> None:
    store_port = free_port()
    token = secrets.token_hex(16)
    go = tmp_path / "go"
    env = {"TNT_MASTER_PORT": str(store_port), "TNT_JOB_TOKEN": token, "TNT_TIMEOUT_S": "90", "GO_FILE": str(go)}
    job = Job(2, rank_code(), tmp_path, env=env)
    try:
        rank0_ports(job, store_port)

        # The protocol works for this client: a try-get of a missing key answers "0".
        s = store_client(store_port, token)
        try_get_missing(s)
        s.close()
        # A huge key length, then a huge value length: a refusal that says why, then the close.
        for request in (
            b"S" + struct.pack("<I", 0xFFFFFFF0),
            b"S" + struct.pack("<I", 3) + b"key" + struct.pack("<I", 0x7FFFFFFF),
        ):
            s = store_client(store_port, token)
            s.sendall(request)
            assert read_exact(s, 4) == b"\xff\xff\xff\xff"
            (length,) = struct.unpack("<I", read_exact(s, 4))
            why = read_exact(s, length).decode()
            assert "limit" in why and ("key" in why or "value" in why), why
            assert s.recv(1) == b""
            s.close()
        # The store still serves the job.
        go.touch()
        check_exact(job.wait(90), 2)
    finally:
        job.kill()


@pytest.mark.timeout(180)
def test_connection_flood_under_low_file_limit_neither_spins_nor_stops_the_job(tmp_path: Path) -> None:
    store_port = free_port()
    go = tmp_path / "go"
    env = {"TNT_MASTER_PORT": str(store_port), "TNT_TIMEOUT_S": "120", "GO_FILE": str(go)}
    # Rank 0 may hold 256 descriptors; the test holds 300 to its store and 100 to its peer port and
    # reopens each one rank 0 closes, so the flood goes on for the whole start.
    with Holder([b""]) as holder:
        holder.hold(store_port, 300)
        job = Job(2, rank_code(low_limit=True), tmp_path, env=env)
        try:
            _, peer_port = rank0_ports(job, store_port)
            holder.hold(peer_port, 100)
            wait_for("the flood to open 400 connections", lambda: holder.opened >= 400, 60, job)
            proc = psutil.Process(job.procs[0].pid)
            before, t0 = proc.cpu_times(), time.monotonic()
            time.sleep(3.0)
            after, t1 = proc.cpu_times(), time.monotonic()
            busy = (after.user + after.system - before.user - before.system) / (t1 - t0)
            go.touch()
            results = job.wait(150)
        finally:
            job.kill()
    print(f"rank 0 busy {busy:.1%}, {holder.opened} opened, {holder.closed_by_server} closed by rank 0")
    check_exact(results, 2)
    # Spinning on a listener that stays readable would use a whole core.
    assert busy < 0.5, f"rank 0 used {busy:.0%} of a core while flooded"
    # Rank 0 closed strangers rather than keeping them until its descriptors ran out.
    assert holder.closed_by_server >= 300, holder.closed_by_server
    assert not job.shm_leftovers()


@pytest.mark.timeout(180)
def test_store_out_of_descriptors_backs_off_and_keeps_serving(tmp_path: Path) -> None:
    store_port = free_port()
    token = secrets.token_hex(16)
    go = tmp_path / "go"
    env = {"TNT_MASTER_PORT": str(store_port), "TNT_JOB_TOKEN": token, "TNT_TIMEOUT_S": "120", "GO_FILE": str(go)}
    job = Job(2, rank_code(low_limit=True, nearly_full=True), tmp_path, env=env)
    try:
        rank0_ports(job, store_port)
        proc = psutil.Process(job.procs[0].pid)
        client = store_client(store_port, token)
        with Holder([b""]) as holder:
            holder.hold(store_port, 100)
            wait_for("rank 0 to run out of descriptors", lambda: proc.num_fds() >= 250, 60, job)
            before, t0 = proc.cpu_times(), time.monotonic()
            for _ in range(6):
                try_get_missing(client)  # an authenticated client is still served
                time.sleep(0.5)
            after, t1 = proc.cpu_times(), time.monotonic()
            busy = (after.user + after.system - before.user - before.system) / (t1 - t0)
        # The flood is over: rank 0 gets its descriptors back and the job starts.
        wait_for("rank 0 to close the strangers", lambda: proc.num_fds() < 250, 4 * HELLO_S + 5, job)
        try_get_missing(client)
        client.close()
        go.touch()
        results = job.wait(150)
    finally:
        job.kill()
    print(f"rank 0 busy {busy:.1%} out of descriptors, {holder.opened} opened, {holder.closed_by_server} closed")
    check_exact(results, 2)
    assert busy < 0.5, f"rank 0 used {busy:.0%} of a core while out of descriptors"
    assert not job.shm_leftovers()
