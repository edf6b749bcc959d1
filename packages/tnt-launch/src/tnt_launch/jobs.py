"""The registry of running tnt-launch jobs on one host, and process control by PID built on it.

Every launch records its processes here: the launcher writes one entry on its own host and the
agent of every rank writes one on the rank's host. `--cleanup` reads these entries to stop earlier
jobs, and the end of every job removes what that job left. A process is identified by its PID *and*
its start time, so a recycled PID is never mistaken for a job's process, and nothing is ever found
by matching process names.

Standard library only, Linux /proc only, Python 3.8+: tnt-launch ships this file's source to other
hosts over ssh, where the package need not be installed.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import time
from collections.abc import Sequence
from typing import Any

GRACE_S = 5.0
"""Seconds a process gets between SIGTERM and SIGKILL."""

_JOB_ID = re.compile(r"^[A-Za-z0-9]+$")


class RegistryError(RuntimeError):
    """The registry folder cannot be used safely."""


def registry_override() -> str | None:
    """TNT_LAUNCH_REGISTRY: the registry folder to use on every host instead of the default."""
    return os.environ.get("TNT_LAUNCH_REGISTRY") or None


def registry_path(override: str | None = None) -> str:
    """The registry folder of this user on this host, without creating it (for --dry-run)."""
    return override or os.path.join("/tmp", f"tnt-launch-{os.getuid()}")


def registry_dir(override: str | None = None) -> str:
    """Return the registry folder of this user on this host, creating it private (0700).

    It lives in /tmp, not in the home folder, because PIDs are per host and homes are often shared
    between hosts. `override` (from TNT_LAUNCH_REGISTRY) replaces it, e.g. to isolate tests.
    """
    path = registry_path(override)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
        raise RegistryError(
            f"job registry {path} is not a folder owned by this user; remove it or set "
            "TNT_LAUNCH_REGISTRY to another folder"
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


# ---------------------------------------------------------------------------------------------
# Processes, read from /proc


def start_time(pid: int) -> int | None:
    """Start time of a live process (clock ticks since boot), or None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: parse after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def state_of(pid: int) -> str | None:
    """The state letter of a process in /proc/PID/stat (R, S, D, T stopped, t stopped by a
    tracer, Z, ...), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat[stat.rindex(")") + 2 :].split()[0]
    except (OSError, ValueError, IndexError):
        return None


STOPPED_STATES = ("T", "t")
"""States of a process that cannot run until it is continued (SIGCONT) or its tracer lets go."""


def stopped_processes(pids: list[int]) -> list[list[Any]]:
    """[pid, state] of those of `pids` that are stopped or stopped by a tracer (a debugger)."""
    found = []
    for pid in pids:
        state = state_of(pid)
        if state in STOPPED_STATES:
            found.append([pid, state])
    return found


def is_alive(pid: int, started: int | None) -> bool:
    """Whether `pid` still is the process that started at `started`."""
    return started is not None and start_time(pid) == started


def _owner(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return parents


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`."""
    return [child for child, parent in _parents().items() if parent == pid]


def descendants(pid: int) -> list[int]:
    """All descendants of `pid`, parents before children."""
    parents = _parents()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop(0)
        kids = [child for child, parent in parents.items() if parent == current]
        found.extend(kids)
        frontier.extend(kids)
    return found


def signal_tree(pid: int, started: int | None, sig: int) -> None:
    """Send `sig` to a process and all its descendants, if it still is the process we recorded."""
    if not is_alive(pid, started):
        return
    for target in [pid] + descendants(pid):
        try:
            os.kill(target, sig)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# Entries


def write_entry(directory: str, name: str, data: dict[str, Any]) -> str:
    """Atomically write the entry `name` (e.g. '<job>.rank3.json') and return its path."""
    path = os.path.join(directory, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def remove_entry(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def read_entries(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """All readable entries of the registry, as (path, data)."""
    entries = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("job_id"), str):
            entries.append((path, data))
    return entries


def machinefile_path(directory: str, job_id: str) -> str:
    """Where the launcher keeps the GPI-2 machinefile of job `job_id`: beside its entry, in the
    private registry folder, so that finishing or cleaning up the job removes it too."""
    return os.path.join(directory, f"{job_id}.gpi2-machines")


def _remove_machinefile(directory: str, job_id: str) -> None:
    # Job ids come from entries; one that is not ours in form names no file of ours either.
    if _JOB_ID.match(job_id):
        remove_entry(machinefile_path(directory, job_id))


def write_machinefile(path: str, hosts: Sequence[str]) -> None:
    """Atomically write a GPI-2 machinefile, private (0600): one host a line, one line per rank in
    rank order. Every line ends in a newline, the last one too: GPI-2 cuts each line's last
    character as its newline."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(host + "\n" for host in hosts))
    os.replace(tmp, path)


def gpi2_port_bases(directory: str) -> set[int]:
    """The TNT_GPI2_PORT_BASE of every job registered here whose launcher still runs: a job
    holds its range from the start, before its ranks bind the ports."""
    bases: set[int] = set()
    for _, data in read_entries(directory):
        base = data.get("gpi2_port_base")
        if isinstance(base, int) and _live_processes(data):
            bases.add(base)
    return bases


def process_entry(pid: int) -> dict[str, int | None]:
    """The identity of a process as entries store it."""
    return {"pid": pid, "start": start_time(pid)}


def _live_processes(data: dict[str, Any]) -> list[dict[str, Any]]:
    uid = os.getuid()
    return [
        p
        for p in data.get("processes", [])
        if is_alive(p["pid"], p.get("start")) and _owner(p["pid"]) == uid
    ]


def script_matches(data: dict[str, Any], script: str | None, script_path: str | None) -> bool:
    """Whether a job runs the SCRIPT given to --cleanup.

    A SCRIPT containing '/' is compared by its resolved path; a bare name by file name, so that
    `--cleanup -- train.py` works from any folder.
    """
    if script is None:
        return True
    if "/" in script:
        return data.get("script_path") == script_path
    return os.path.basename(str(data.get("script", ""))) == script


# ---------------------------------------------------------------------------------------------
# Stopping jobs


def cleanup(
    directory: str,
    script: str | None = None,
    script_path: str | None = None,
    force: bool = False,
    grace: float = GRACE_S,
) -> list[dict[str, Any]]:
    """Stop the registered jobs on this host (those running `script` when given).

    SIGTERM lets a launcher bring its whole job down and lets a rank's agent stop its rank
    gracefully; whatever still runs after `grace` seconds, or everything at once with `force`,
    gets SIGKILL. Entries of jobs that are no longer running are removed. Returns one record per
    stopped job: job id, script, roles and the number of processes signalled.
    """
    by_job: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, data in read_entries(directory):
        by_job.setdefault(data["job_id"], []).append((path, data))

    stopped = []
    targets: list[tuple[dict[str, Any], str]] = []
    for job_id, entries in sorted(by_job.items()):
        live = [(path, data, _live_processes(data)) for path, data in entries]
        if not any(procs for _, _, procs in live):
            for path, _ in entries:
                remove_entry(path)
            # Left by a launcher that was killed (SIGKILL) before it could tidy up.
            _remove_machinefile(directory, job_id)
            continue
        if not any(script_matches(data, script, script_path) for _, data in entries):
            continue
        count = 0
        for _, data, procs in live:
            for proc in procs:
                targets.append((proc, data.get("role", "")))
                count += 1
        stopped.append(
            {
                "job_id": job_id,
                "script": entries[0][1].get("script"),
                "roles": sorted({str(d.get("role")) for _, d in entries}),
                "processes": count,
            }
        )

    if force:
        for proc, _ in targets:
            signal_tree(proc["pid"], proc.get("start"), signal.SIGKILL)
    else:
        # A launcher answers SIGTERM by bringing its whole job down, an agent by stopping its
        # rank's process group; the rank gets it directly too in case its agent is gone.
        for proc, _ in targets:
            if is_alive(proc["pid"], proc.get("start")):
                try:
                    os.kill(proc["pid"], signal.SIGTERM)
                    # A stopped process acts on SIGTERM only once it is continued.
                    os.kill(proc["pid"], signal.SIGCONT)
                except OSError:
                    pass

    deadline = time.monotonic() + (1.0 if force else grace + 2.0)
    while time.monotonic() < deadline:
        if not any(is_alive(p["pid"], p.get("start")) for p, _ in targets):
            break
        time.sleep(0.05)
    for proc, _ in targets:
        signal_tree(proc["pid"], proc.get("start"), signal.SIGKILL)

    stopped_ids = {record["job_id"] for record in stopped}
    for job_id in stopped_ids:
        for path, _ in by_job[job_id]:
            remove_entry(path)
        _remove_machinefile(directory, job_id)
    return stopped


def finish_job(directory: str, job_id: str, shm: bool = True) -> dict[str, int]:
    """Make sure nothing of job `job_id` is left on this host once the job has ended.

    Kills any of its registered processes still alive and removes its entries and its GPI-2
    machinefile; with `shm`, also removes shared memory files /dev/shm/tnt-<job_id>-* that the
    collectives library could not unlink itself (for example because a rank was killed while
    mapping them).
    """
    if not _JOB_ID.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}")
    killed = 0
    for path, data in read_entries(directory):
        if data["job_id"] != job_id:
            continue
        for proc in _live_processes(data):
            if data.get("role") == "launcher" and proc["pid"] == os.getpid():
                continue
            signal_tree(proc["pid"], proc.get("start"), signal.SIGKILL)
            killed += 1
        remove_entry(path)
    _remove_machinefile(directory, job_id)
    removed = 0
    uid = os.getuid()
    for path in glob.glob(f"/dev/shm/tnt-{job_id}-*") if shm else ():
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return {"killed": killed, "shm_removed": removed}
