"""A rank for the tests: reports what it received, then behaves as asked.

It writes REPORT_DIR/rank-<TNT_RANK>.json (environment, argv, working directory, PIDs, the CPUs and
memory nodes it may use, its NUMA policy, the GPI-2 machinefile that GASPI_MFILE names), prints one
line to stdout and one to stderr, and then exits, fails, kills itself or sleeps. Imports nothing of
tnt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def _status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _wait_for_reports(folder: str, size: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    paths = [os.path.join(folder, f"rank-{r}.json") for r in range(size)]
    while not all(map(os.path.exists, paths)) and time.monotonic() < deadline:
        time.sleep(0.02)


def _claimed(base: str | None) -> bool | None:
    """Whether someone holds the claim on the first block of GPI-2 port base `base`: the abstract
    socket name tnt-launch and tnt-comm bind for it (tnt_launch/gpi2.py)."""
    if not base:
        return None
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.bind(f"\0tnt-gpi2-ports:{base}")
        except OSError:
            return True
    return False


def _report_error(error: dict) -> None:
    """What tnt-comm writes to the launcher's report pipe for the exception a rank ends with."""
    fd = int(os.environ["TNT_REPORT_FD"])
    os.write(fd, (json.dumps({"event": "error", "error": error}) + "\n").encode())


def _raise_late(rank: int, culprit: int, silent: bool, code: int) -> int:
    """The order tnt-launch must see through: every other rank reports a PeerFailure that names
    `culprit` and exits at once; `culprit` speaks half a second later (its report of a ValueError,
    and its traceback's last line) and exits 3 s after that (an exit handler, say). With `silent`, it
    reports nothing and exits with `code` after the half second."""
    if rank != culprit:
        _report_error({"kind": "PeerFailure", "message": f"rank {culprit} failed (ValueError: planted)",
                       "ranks": [culprit], "operation": "allreduce", "peer_error": "ValueError: planted"})
        print(f"rank {rank} lost rank {culprit}", file=sys.stderr)
        return 1
    time.sleep(0.5)
    if silent:
        print(f"rank {rank} exits with code {code}", file=sys.stderr)
        return code
    _report_error({"kind": "ValueError", "message": f"planted on rank {rank}\nsecond line", "ranks": []})
    print(f"ValueError: planted on rank {rank}", file=sys.stderr)
    sys.stderr.flush()
    os.write(int(os.environ["TNT_REPORT_FD"]), b'{"event": "printed"}\n')  # as tnt-comm's exit hook does
    time.sleep(3)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("report_dir")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1,
                        help="this rank fails on its own, the others (reporting a PeerFailure that names it) "
                             "exit first; see _raise_late")
    parser.add_argument("--silent", action="store_true",
                        help="with --raise-rank: the failing rank reports nothing and exits with --code")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sleep-rank", type=int, default=-1, help="only this rank sleeps")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--touch-shm", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--lines", type=int, default=1)
    parser.add_argument("--progress", action="store_true", help="end with an unfinished line")
    args, rest = parser.parse_known_args()

    rank = int(os.environ["TNT_RANK"])
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = None
    if args.spawn_child:
        # A grandchild in a session of its own: it escapes the rank's process group.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
    shm = None
    if args.touch_shm:
        shm = f"/dev/shm/tnt-{os.environ['TNT_JOB_ID']}-test-{rank}"
        with open(shm, "w") as f:
            f.write("left behind on purpose")
    policy = ""
    if shutil.which("numactl"):
        policy = subprocess.run(["numactl", "--show"], capture_output=True, text=True, check=False
        ).stdout

    # GPI-2's machinefile as this rank finds it (read on rank 0 only, but looked at on all).
    mfile = os.environ.get("GASPI_MFILE")
    machinefile = None
    if mfile and os.path.isfile(mfile):
        with open(mfile) as f:
            machinefile = f.read()

    report = {
        "env": dict(os.environ),
        "machinefile": machinefile,
        # Rank 0 only: two ranks probing one name at once would see each other's probe.
        "gpi2_base_claimed": _claimed(os.environ.get("TNT_GPI2_PORT_BASE")) if rank == 0 else None,
        "argv": sys.argv[1:],
        "rest": rest,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "child_pid": child.pid if child else None,
        "shm": shm,
        "cpus_allowed": _status_field("Cpus_allowed_list"),
        "mems_allowed": _status_field("Mems_allowed_list"),
        "numactl_show": policy,
    }
    path = os.path.join(args.report_dir, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(path + ".tmp", path)

    for i in range(args.lines):
        print(f"stdout line {i} of rank {rank}")
    print(f"stderr line of rank {rank}", file=sys.stderr)
    sys.stdout.flush()
    if args.progress:
        sys.stderr.write(f"progress of rank {rank}: 50%\r")
        sys.stderr.flush()

    if args.raise_rank >= 0:
        _wait_for_reports(args.report_dir, int(os.environ["TNT_SIZE"]))
        return _raise_late(rank, args.raise_rank, args.silent, args.code)
    if rank in (args.kill_rank, args.fail_rank):
        # The tests read every rank's report after the job ends: a rank that ends the job first
        # waits for the others' (on a loaded machine a rank may take seconds to start).
        _wait_for_reports(args.report_dir, int(os.environ["TNT_SIZE"]))
    if rank == args.kill_rank:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == args.fail_rank:
        time.sleep(0.2)
        print(f"rank {rank} fails on purpose with code {args.code}", file=sys.stderr)
        return args.code
    if args.sleep_rank in (-1, rank):
        time.sleep(args.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
