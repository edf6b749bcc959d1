"""The store of an elastic job (--elastic), held by tnt-launch so that it outlives every rank.

tnt-comm's ranks meet at a small key-value store (TNT_MASTER_ADDR/PORT). In a job that is not
elastic rank 0 runs it; in an elastic one the survivors of a lost rank agree there on who is left,
so it must not die with any rank: tnt-launch serves it, in a thread of its own, speaking tnt-comm's
wire format (packages/tnt-comm/src/rendezvous/store.cpp says it). The supervisor also writes there
which ranks it saw end (`mark_lost`), so the survivors need not wait for every one of them to say so.

Every connection must present the job token first, within HELLO_S and among at most MAX_STRANGERS
such connections, and keys and values are capped, so nothing from outside the job can stall it,
exhaust it or make it spin. Standard library only.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

MAGIC = b"TNT1"
MAX_FIELD = 1 << 20
MAX_TOKEN = 4096
REFUSED = 0xFFFFFFFF
HELLO_S = 2.0
MAX_STRANGERS = 64


@dataclass
class _Client:
    sock: socket.socket
    since: float
    authenticated: bool = False
    data: bytearray = field(default_factory=bytearray)


class ElasticStore:
    """Serves the store on `host`:`port` (0: a free port, then `port` says which) until `close`."""

    def __init__(self, host: str, port: int, token: str, job_id: str) -> None:
        self._token = token.encode()
        self._prefix = f"{job_id}/elastic/"
        self._data: dict[bytes, bytes] = {}
        self._waiting: list[tuple[_Client, bytes]] = []
        self._clients: dict[int, _Client] = {}
        self._marks: list[tuple[bytes, bytes]] = []
        self._decisions: list[tuple[int, list[int]]] = []
        self._newest = (0, 0)  # the newest generation the survivors agreed on, and its rank 0's member id
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, port), backlog=128, reuse_port=False)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_r, self._wake_w = os.pipe()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="tnt-launch store", daemon=True)
        self._thread.start()

    def mark_lost(self, rank: int, why: str) -> None:
        """Says at the store that generation 0's rank `rank` is lost (its process ended)."""
        with self._lock:
            self._marks.append(((self._prefix + f"lost/{rank}").encode(), why.encode()[:4096]))
        os.write(self._wake_w, b"m")

    def admitted_in(self, member: int) -> int | None:
        """The generation that admitted the replacement joining as `member` (tnt_comm.admit), None
        while it waits."""
        value = self._data.get((self._prefix + f"admitted/{member}").encode())
        return None if value is None else int(value)

    def take_decisions(self) -> list[tuple[int, list[int]]]:
        """The generations the survivors agreed on since the last call: (generation, the member ids,
        which are generation 0's ranks, in their new rank order)."""
        with self._lock:
            decisions, self._decisions = self._decisions, []
        return decisions

    def first_member(self) -> int:
        """The member id of rank 0 in the newest generation (0 until the job first re-forms): the
        rank whose output tnt-launch shows, which is another process once rank 0 is lost."""
        with self._lock:
            return self._newest[1]

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"q")
        self._thread.join(10)
        for client in list(self._clients.values()):
            client.sock.close()
        self._selector.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the server thread ------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop:
            for key, _ in self._selector.select(timeout=0.5):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
                    self._apply_marks()
                else:
                    self._read(key.data)
            self._drop_slow_strangers()

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            sock, _ = self._listener.accept()
            strangers = sum(1 for c in self._clients.values() if not c.authenticated)
            if strangers >= MAX_STRANGERS:
                sock.close()
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client = _Client(sock, time.monotonic())
            self._clients[sock.fileno()] = client
            self._selector.register(sock, selectors.EVENT_READ, client)

    def _drop(self, client: _Client) -> None:
        self._clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(client.sock)
        self._waiting = [(c, k) for c, k in self._waiting if c is not client]
        client.sock.close()

    def _drop_slow_strangers(self) -> None:
        now = time.monotonic()
        for client in [c for c in self._clients.values() if not c.authenticated and now - c.since > HELLO_S]:
            self._drop(client)

    def _send(self, client: _Client, payload: bytes) -> None:
        try:
            client.sock.setblocking(True)
            client.sock.settimeout(10)
            client.sock.sendall(payload)
            client.sock.setblocking(False)
        except OSError:
            self._drop(client)

    def _reply(self, client: _Client, value: bytes) -> None:
        self._send(client, struct.pack("<I", len(value)) + value)

    def _refuse(self, client: _Client, why: str) -> None:
        text = why.encode()
        self._send(client, struct.pack("<II", REFUSED, len(text)) + text)
        self._drop(client)

    def _read(self, client: _Client) -> None:
        try:
            chunk = client.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(client)
            return
        client.data += chunk
        if not client.authenticated and not self._hello(client):
            return
        self._requests(client)

    def _hello(self, client: _Client) -> bool:
        data = client.data
        if data[: min(len(data), 4)] != MAGIC[: min(len(data), 4)]:
            self._drop(client)
            return False
        if len(data) < 8:
            return False
        (length,) = struct.unpack_from("<I", data, 4)
        if length > max(MAX_TOKEN, len(self._token)):
            self._drop(client)
            return False
        if len(data) < 8 + length:
            return False
        ok = hmac.compare_digest(bytes(data[8 : 8 + length]), self._token)
        del data[: 8 + length]
        self._send(client, b"K" if ok else b"R")
        if not ok:
            self._drop(client)
            return False
        client.authenticated = True
        return True

    def _requests(self, client: _Client) -> None:
        data = client.data
        while client.sock.fileno() >= 0 and len(data) >= 5:
            op = data[0:1]
            (klen,) = struct.unpack_from("<I", data, 1)
            if klen > MAX_FIELD:
                return self._refuse(client, f"a key of {klen} bytes is longer than the {MAX_FIELD}-byte limit")
            if len(data) < 9 + klen:
                return None
            (vlen,) = struct.unpack_from("<I", data, 5 + klen)
            if vlen > MAX_FIELD:
                return self._refuse(client, f"a value of {vlen} bytes is longer than the {MAX_FIELD}-byte limit")
            if len(data) < 9 + klen + vlen:
                return None
            key, value = bytes(data[5 : 5 + klen]), bytes(data[9 + klen : 9 + klen + vlen])
            del data[: 9 + klen + vlen]
            self._handle(client, op, key, value)
        return None

    def _handle(self, client: _Client, op: bytes, key: bytes, value: bytes) -> None:
        if op == b"S":
            self._set(key, value)
            self._reply(client, b"")
        elif op == b"C":
            if key not in self._data:
                self._set(key, value)
                self._note_decision(key, value)
            self._reply(client, self._data[key])
        elif op == b"G":
            if key in self._data:
                self._reply(client, self._data[key])
            else:
                self._waiting.append((client, key))
        elif op == b"T":
            self._reply(client, b"1" + self._data[key] if key in self._data else b"0")
        elif op == b"A":
            try:
                now = int(self._data.get(key, b"0")) + int(value)
            except ValueError:
                return self._refuse(client, "add needs decimal integers")
            self._set(key, str(now).encode())
            self._reply(client, self._data[key])
        else:
            self._refuse(client, f"unknown request {op!r}")
        return None

    def _set(self, key: bytes, value: bytes) -> None:
        self._data[key] = value
        ready = [c for c, k in self._waiting if k == key]
        self._waiting = [(c, k) for c, k in self._waiting if k != key]
        for waiter in ready:
            self._reply(waiter, value)

    def _note_decision(self, key: bytes, value: bytes) -> None:
        """A claim of "<job>/elastic/g<N>/next" is generation N+1's members ("id:node,...")."""
        name = key.decode(errors="replace")
        if not (name.startswith(self._prefix + "g") and name.endswith("/next")):
            return
        try:
            generation = int(name[len(self._prefix) + 1 : -len("/next")]) + 1
            members = [int(item.split(":")[0]) for item in value.decode().split(",") if item]
        except ValueError:
            return
        with self._lock:
            self._decisions.append((generation, members))
            if members and generation > self._newest[0]:
                self._newest = (generation, members[0])

    def _apply_marks(self) -> None:
        with self._lock:
            marks, self._marks = self._marks, []
        for key, why in marks:
            if key not in self._data:
                self._set(key, why)
