"""The helper tnt-launch runs on the hosts of a job: beside every rank, and for per-host queries.

tnt-launch starts it with a JSON request on its first line of stdin (see `agents.py`), locally or
over ssh, in one of four modes:

- ``run``: start one rank and look after it. The rank gets its own process group; the agent makes
  itself a child subreaper so that nothing the rank starts can escape it. It stops the rank
  (SIGTERM to the group, SIGKILL after the grace period) when asked ('T' on stdin; 'K' kills at
  once), when it gets SIGTERM/SIGINT/SIGHUP, and when its stdin closes: the launcher or the ssh
  connection is gone. SIGTERM is followed by SIGCONT, so that a stopped rank (SIGSTOP, Ctrl+Z)
  acts on it. Once the rank has exited, everything left of it is killed. The agent talks to
  tnt-launch on stderr, in lines starting with `MARKER`: {"event": "ready"} as soon as it runs,
  {"event": "error", ...} with the exception the rank ends with, as data, the moment the rank
  reports it (see `contract.REPORT_FD`), {"event": "printed"} once the rank's traceback is written,
  {"event": "exit", ...} with the rank's status at the end, and
  {"event": "state", ...} in
  answer to 'S' on stdin: which processes of the rank are stopped (state T) or stopped by a
  tracer (t, a debugger), checked here because only this host can see them. SIGUSR1 (or 'U' on
  stdin) is passed on to the rank's process group: a warning before the job's end, which tnt-keras
  turns into a checkpoint. Each such line is
  written with one write() of less than PIPE_BUF bytes, so it never splits, nor is split by, a
  write of the rank's own.
- ``probe``: describe this host (GPUs, CPUs, NUMA nodes, numactl, optionally a free TCP port).
- ``cleanup``: `jobs.cleanup` on this host.  ``finish``: `jobs.finish_job` on this host.

Under srun every task of a step reads the same request (mode ``step``) and takes its own from it
by SLURM_PROCID.

Standard library only, Python 3.8+: its source travels over ssh together with `jobs.py` and
`contract.py`.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from tnt_launch import contract, jobs

MARKER = "\x1eTNT-AGENT "
"""Starts the lines an agent writes to stderr for tnt-launch (never shown to users)."""

_REPORT_CHARS = 1500
"""The longest text of a report the agent passes on: its line must stay below PIPE_BUF bytes."""

_PR_SET_CHILD_SUBREAPER = 36

ADDRESSED = b"@"
"""Under srun, where every agent of a step reads the same stdin, ``@TASK:C;`` is the control byte C
('T' or 'K') for the agent of task TASK alone (``_own_commands``): one rank of the step is stopped
(an elastic job's rank left out), the others go on."""

FORWARDED = signal.SIGUSR1
"""The signal the agent passes on to its rank, when it gets it or is told 'U' on stdin."""


class _Stopper:
    """Stops the rank's process group once, gracefully or at once, from any thread."""

    def __init__(self, grace: float) -> None:
        self._lock = threading.RLock()
        self._grace = grace
        self._pid: int | None = None
        self._requested = False
        self._forced = False
        self._done = False
        self._timer: threading.Timer | None = None
        # Signals to pass on that came before the rank's PID was known: the rank may already run
        # (and a test see it ready) while this agent has not yet recorded the PID Popen returned.
        self._held: list[int] = []

    def attach(self, pid: int) -> None:
        with self._lock:
            self._pid = pid
            held, self._held = self._held, []
            for sig in held:
                self._signal(sig)
            if self._forced:
                self._signal(signal.SIGKILL)
            elif self._requested:
                self._terminate()

    def request(self, force: bool = False) -> None:
        with self._lock:
            if force and not self._forced:
                self._forced = True
                self._signal(signal.SIGKILL)
            elif not self._requested:
                self._requested = True
                if self._pid is not None:
                    self._terminate()

    @property
    def pid(self) -> int | None:
        """The rank's PID while it runs; None before it starts and once it has been reaped."""
        with self._lock:
            return None if self._done else self._pid

    def forward(self, sig: int) -> None:
        """Pass `sig` on to the rank's process group (a preemption warning: SIGUSR1); before the rank
        started, once it has."""
        with self._lock:
            if self._pid is None and not self._done:
                self._held.append(sig)
                return
            self._signal(sig)

    def finished(self) -> None:
        with self._lock:
            self._done = True
            if self._timer is not None:
                self._timer.cancel()

    def _terminate(self) -> None:
        self._signal(signal.SIGTERM)
        # Stopped processes act on SIGTERM only once continued; SIGCONT is harmless to the rest.
        self._signal(signal.SIGCONT)
        self._timer = threading.Timer(self._grace, self._signal, (signal.SIGKILL,))
        self._timer.daemon = True
        self._timer.start()

    def _signal(self, sig: int) -> None:
        with self._lock:
            # Until the rank is reaped its PID, and so its group, cannot be reused.
            if self._pid is None or self._done:
                return
            try:
                os.killpg(self._pid, sig)
            except OSError:
                pass


_MAX_LISTED = 8


def rank_state(rank: int, pid: int | None) -> dict[str, Any]:
    """The answer to 'S': whether the rank runs, and which of its processes are stopped."""
    message: dict[str, Any] = {"event": "state", "rank": rank, "running": pid is not None}
    if pid is not None:
        # The rank, what it started, and orphans of it that this agent adopted as subreaper.
        stopped = jobs.stopped_processes([pid] + [p for p in jobs.descendants(os.getpid())
                                                  if p != pid])
        message["stopped"] = stopped[:_MAX_LISTED]
        message["rank_state"] = jobs.state_of(pid)
    return message


def _own_commands(data: bytes, task: int | None) -> tuple[bytes, bytes, bytes]:
    """(the plain control bytes of `data`, the addressed commands for `task`, an incomplete addressed
    command at its end, to be read with what follows)."""
    plain, own = bytearray(), bytearray()
    while data:
        at = data.find(ADDRESSED)
        if at < 0:
            plain += data
            break
        plain += data[:at]
        end = data.find(b";", at)
        if end < 0:
            return bytes(plain), bytes(own), data[at:]
        target, _, command = data[at + 1 : end].partition(b":")
        if task is not None and target.isdigit() and int(target) == task:
            own += command
        data = data[end + 1 :]
    return bytes(plain), bytes(own), b""


def _watch_stdin(stopper: _Stopper, pending: bytes, rank: int, task: int | None = None) -> None:
    data, carried = pending, b""
    while True:
        plain, own, carried = _own_commands(carried + data, task)
        if b"K" in own:
            stopper.request(force=True)
        elif b"T" in own:
            stopper.request()
        data = plain
        if b"S" in data:
            _tell(rank_state(rank, stopper.pid))
        for _ in range(data.count(b"U")):
            stopper.forward(FORWARDED)
        if b"K" in data:
            stopper.request(force=True)
        elif b"T" in data:
            stopper.request()
        try:
            data = os.read(0, 4096)
        except OSError:
            data = b""
        if not data:
            stopper.request()
            return


def _become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _wait_exit(pid: int) -> tuple[int | None, int | None]:
    """Wait for the rank to end without reaping it; return (exit code, None) or (None, signal)."""
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        if info is None:
            continue
        if info.si_code == os.CLD_EXITED:
            return info.si_status, None
        return None, info.si_status


def _reap_leftovers(pid: int) -> None:
    """Kill what is left of the rank: its process group and any orphan we adopted."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    for _ in range(200):
        orphans = jobs.children_of(os.getpid())
        if not orphans:
            return
        for orphan in orphans:
            try:
                os.kill(orphan, signal.SIGKILL)
            except OSError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.01)


def _tell(message: dict[str, Any]) -> None:
    try:
        os.write(2, (MARKER + json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _relay_reports(fd: int, rank: int) -> None:
    """Pass the rank's error reports on to tnt-launch as they come, until the pipe closes (the rank
    and everything it started have exited)."""
    with os.fdopen(fd, "rb") as reports:
        for line in reports:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if message.get("event") == "printed":
                # After the rank's traceback on the same stderr: tnt-launch has read it when this comes.
                _tell({"event": "printed", "rank": rank})
                continue
            if message.get("event") != "error":
                continue
            error = message.get("error")
            if isinstance(error, dict):
                error = {k: v[:_REPORT_CHARS] if isinstance(v, str) else v for k, v in error.items()}
                if isinstance(error.get("ranks"), list):
                    error["ranks"] = error["ranks"][:64]
            _tell({"event": "error", "rank": rank, "error": error})


def _report(rank: int, code: int | None, sig: int | None = None, error: str | None = None) -> int:
    _tell({"event": "exit", "rank": rank, "code": code, "signal": sig, "error": error})
    return code if code is not None else 128 + (sig or 0)


def run_rank(request: dict[str, Any], pending: bytes = b"") -> int:
    """Start the rank described by `request`, supervise it, report its status; return exit code."""
    rank = int(request["rank"])
    _tell({"event": "ready", "rank": rank})
    stopper = _Stopper(float(request.get("grace", jobs.GRACE_S)))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stopper.request())
    # A warning before the end (Slurm's --signal=USR1@T signals every process of the job's steps, this
    # agent too): passed on to the rank, which it would otherwise end with the agent.
    signal.signal(FORWARDED, lambda *_: stopper.forward(FORWARDED))
    _become_subreaper()
    task = request.get("task")  # under srun: this agent's task of the step
    threading.Thread(target=_watch_stdin, args=(stopper, pending, rank, task), daemon=True).start()

    cwd = request["cwd"]
    try:
        os.chdir(cwd)
    except OSError as e:
        host = socket.gethostname()
        error = f"cannot enter working directory {cwd} on {host}: {e.strerror}"
        return _report(rank, 1, error=error)
    try:
        registry = jobs.registry_dir(request.get("registry"))
    except (OSError, jobs.RegistryError) as e:
        return _report(rank, 1, error=str(e))

    env = dict(os.environ)
    env.update(request["env"])
    argv = list(request["argv"])
    report_read, report_write = os.pipe()
    # tnt_comm reports there the exception the rank ends with; the agent passes it on.
    env[contract.REPORT_FD] = str(report_write)
    try:
        child = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(report_write,)
        )
    except OSError as e:
        os.close(report_read)
        code = 127 if e.errno == errno.ENOENT else 126
        return _report(rank, code, error=f"cannot run {argv[0]}: {e.strerror}")
    finally:
        os.close(report_write)
    relay = threading.Thread(target=_relay_reports, args=(report_read, rank), daemon=True)
    relay.start()

    entry = jobs.write_entry(
        registry,
        f"{request['job_id']}.rank{rank}.json",
        {
            "job_id": request["job_id"],
            "role": f"rank{rank}",
            "script": request.get("script"),
            "script_path": request.get("script_path"),
            "processes": [jobs.process_entry(os.getpid()), jobs.process_entry(child.pid)],
        },
    )
    stopper.attach(child.pid)
    code, sig = _wait_exit(child.pid)
    # Nothing the rank started may outlive it.
    _reap_leftovers(child.pid)
    stopper.finished()
    child.returncode = code if code is not None else -(sig or 0)
    jobs.remove_entry(entry)
    relay.join(timeout=2.0)  # the rank's report, if any, goes out before its exit
    return _report(rank, code, sig)


# ---------------------------------------------------------------------------------------------
# Probing a host


def _count_cpus(cpulist: str) -> int:
    count = 0
    for part in cpulist.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def numa_nodes(root: str = "/sys/devices/system/node") -> list[list[int]]:
    """[node id, number of CPUs] of every NUMA node that has CPUs, in node order."""
    nodes = []
    for path in glob.glob(os.path.join(root, "node[0-9]*")):
        try:
            with open(os.path.join(path, "cpulist")) as f:
                cpus = _count_cpus(f.read())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes.append([int(os.path.basename(path)[4:]), cpus])
    return sorted(nodes)


def detect_gpus(environ: Mapping[str, str]) -> list[str]:
    """GPUs usable here: CUDA_VISIBLE_DEVICES when set (as CUDA reads it), else nvidia-smi's."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = []
        for token in visible.split(","):
            token = token.strip()
            # CUDA stops at the first invalid entry; these are the usual ways to hide all GPUs.
            if not token or token == "-1" or token.lower() == "nodevfiles":
                break
            gpus.append(token)
        return gpus
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().isdigit()]


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def probe(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cpus": len(os.sched_getaffinity(0)),
        "gpus": detect_gpus(os.environ),
        "numa": numa_nodes(),
        "numactl": shutil.which("numactl") is not None,
        "port": free_port() if request.get("want_port") else None,
    }


def serve(request: dict[str, Any]) -> Any:
    """Answer a probe, cleanup or finish request; errors come back as {"error": message}."""
    mode = request.get("mode")
    try:
        if mode == "probe":
            return probe(request)
        registry = jobs.registry_dir(request.get("registry"))
        if mode == "cleanup":
            return jobs.cleanup(
                registry,
                request.get("script"),
                request.get("script_path"),
                force=bool(request.get("force")),
                grace=float(request.get("grace", jobs.GRACE_S)),
            )
        if mode == "finish":
            return jobs.finish_job(registry, request["job_id"], bool(request.get("shm", True)))
        return {"error": f"unknown request {mode!r}"}
    except (OSError, ValueError, jobs.RegistryError) as e:
        return {"error": str(e)}


def task_request(step: dict[str, Any]) -> dict[str, Any]:
    """This task's own request out of an srun step's (`starters/srun.py: step_request`): task r, rank r's."""
    task = int(os.environ["SLURM_PROCID"])
    own = step["ranks"][task]
    request = {**step["common"], **own, "task": task}
    request["env"] = {**step["common"].get("env", {}), **own.get("env", {})}
    return request


def main(request: dict[str, Any], pending: bytes = b"") -> int:
    """Entry point of the bootstrap that `agents.py` sends: serve one request, return exit code."""
    if request.get("mode") == "step":
        request = task_request(request)
    if request.get("mode") == "run":
        return run_rank(request, pending)
    result = serve(request)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 1 if isinstance(result, dict) and "error" in result else 0
