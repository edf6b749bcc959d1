"""Ranks started as the tasks of one srun step inside a Slurm allocation (launcher "srun"): every
task runs an agent (`_agent.py`), which takes its rank's request by SLURM_PROCID; srun labels the
tasks' output lines with the task (= rank), and hands every task the same stdin. `slurm.py` has what
Slurm offers (the allocation) and the srun lines; this module runs the step.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from tnt_launch import agents, slurm
from tnt_launch._agent import ADDRESSED
from tnt_launch.config import LaunchError
from tnt_launch.hosts import Host
from tnt_launch.plan import RankSpec
from tnt_launch.rank_run import RankRun, RankStatus, Read, Stream, read_available, split_lines
from tnt_launch.starters import Answers, Started


def srun_program() -> list[str]:
    """What every task of an srun step runs: the agent, under tnt-launch's interpreter where the node
    has it (a shared installation), else under the first python3 on its PATH."""
    return ["/bin/sh", "-c", agents.remote_command(sys.executable)]


def step_request(requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One request for all the tasks of an srun step (srun hands every task the same stdin): what the
    ranks share once, and each rank's own variables and command; the agent of task r takes rank r's."""
    first = requests[0]
    common = {k: v for k, v in first.items() if k not in ("env", "rank") and all(r.get(k) == v for r in requests)}
    if "env" not in first:
        return {"mode": "step", "common": common, "ranks": [{k: v for k, v in r.items() if k not in common} for r in requests]}
    shared_env = {k: v for k, v in first["env"].items() if all(r["env"].get(k) == v for r in requests)}
    ranks = []
    for request in requests:
        own = {k: v for k, v in request.items() if k not in common and k != "env"}
        own["env"] = {k: v for k, v in request["env"].items() if k not in shared_env}
        ranks.append(own)
    return {"mode": "step", "common": {**common, "env": shared_env}, "ranks": ranks}


def write_slurm_hostfile(nodes: Sequence[str]) -> str:
    """A SLURM_HOSTFILE for `--distribution=arbitrary`: task i runs on nodes[i]. The caller removes it."""
    fd, path = tempfile.mkstemp(prefix="tnt-launch-slurm-hosts-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{node}\n" for node in nodes))
    return path


def start_step(argv: Sequence[str], hostfile: str, request: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start an srun step whose tasks all read `request` (see `step_request`) on stdin."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "SLURM_HOSTFILE": hostfile},
        start_new_session=True,
    )
    return agents.hand_request(proc, request)


class Step:
    """The srun step that runs every rank's agent as one of its tasks (launcher "srun").

    srun hands every task the same stdin, so a control byte ('S', 'U') reaches all agents: each is
    sent once, as the job-wide requests they are. Stopping ('T') and killing ('K') are addressed to
    one task ('@TASK:C;', ``_agent.ADDRESSED``): an elastic job stops a rank it left out and keeps
    the others. stdin closes once every rank has finished (its agent stops its rank when it closes),
    or when tnt-launch ends."""

    def __init__(self, proc: subprocess.Popen[bytes], hostfile: str, size: int) -> None:
        self.proc = proc
        self.hostfile = hostfile
        self.size = size
        self.sent: set[bytes] = set()
        self.done: set[int] = set()

    def send(self, command: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        if command != b"U":  # a forwarded signal goes out each time; a request once
            if command in self.sent:
                return
            self.sent.add(command)
        self._write(command)

    def send_to(self, task: int, command: bytes) -> None:
        """Control byte ``command`` for the agent of ``task`` alone."""
        self._write(b"%s%d:%s;" % (ADDRESSED, task, command))

    def _write(self, data: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def finished(self, task: int) -> None:
        self.done.add(task)
        if len(self.done) == self.size:
            self.close()

    def kill(self, task: int) -> None:
        """Kills ``task``'s rank; srun itself (and with it every task left) once no other task runs."""
        self.send_to(task, b"K")
        self.finished(task)
        if len(self.done) == self.size and self.proc.poll() is None:
            self.proc.kill()

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class StepControl:
    """One rank's part of the step's stdin: requests go to every agent once; closing waits for all."""

    def __init__(self, step: Step, task: int) -> None:
        self.step = step
        self.task = task

    def send(self, command: bytes) -> None:
        if command in (b"T", b"K"):  # this rank's, not the step's
            self.step.send_to(self.task, command)
        else:
            self.step.send(command)

    def finished(self) -> None:
        self.step.finished(self.task)

    def kill(self) -> None:
        self.step.kill(self.task)


class StepStream:
    """srun's stdout or stderr: lines labelled with the task, for that task's rank's stream
    (`streams`: the runs' streams of this name, by task: task r is rank r in the job's first step,
    the replacement in a step of its own is task 0); a `rank_run.Source`."""

    def __init__(self, name: str, fd: int, streams: dict[int, Stream]) -> None:
        self.name = name
        self.fd = fd
        self.streams = streams
        self.partial = b""
        self.open = True

    def read(self) -> Read | None:
        data = read_available(self.fd)
        if data is None:
            return None
        if data:
            return Read(self.lines(data))
        self.open = False
        return Read(self.rest(), ended=list(self.streams.values()))

    def lines(self, data: bytes) -> list[tuple[Stream | None, bytes]]:
        """The complete lines in `data` (with what came before), each with the rank stream it is for
        (None for srun's own)."""
        lines, self.partial = split_lines(self.partial, data)
        return [self._route(line + b"\n") for line in lines]

    def rest(self) -> list[tuple[Stream | None, bytes]]:
        partial, self.partial = self.partial, b""
        return [self._route(partial + b"\n")] if partial else []

    def _route(self, line: bytes) -> tuple[Stream | None, bytes]:
        labelled = slurm.split_label(line)
        if labelled is None or labelled[0] not in self.streams:
            return None, line
        return self.streams[labelled[0]], labelled[1]


class SrunStep:
    """Starts every rank at once, as the tasks of one srun step (task r on rank r's node). An elastic
    job's replacement ranks start later, each as a step of its own that shares the first step's CPUs
    (``--overlap``: the lost rank's task holds them until the whole first step ends)."""

    def __init__(self, cpus_per_task: int | None = None, no_kill: bool = False) -> None:
        self.cpus_per_task = cpus_per_task  # srun's --cpus-per-task, from the allocation
        self.no_kill = no_kill  # an elastic job's steps go on when Slurm finds one of their nodes failed
        self.steps: list[Step] = []
        self.sources: list[StepStream] = []

    def start(self, specs: Sequence[RankSpec], request: Callable[[RankSpec], dict[str, Any]],
              runs: Sequence[RankRun]) -> Started:
        started = Started()
        if not specs:
            return started
        hostfile = write_slurm_hostfile([spec.host for spec in specs])
        argv = slurm.srun_argv(
            len(specs), self.cpus_per_task, srun_program(), overlap=bool(self.steps), no_kill=self.no_kill
        )
        try:
            proc = start_step(argv, hostfile, step_request([request(spec) for spec in specs]))
        except OSError as e:
            os.unlink(hostfile)
            for spec in specs:
                run = RankRun(spec, None)
                run.status = RankStatus(127, error=f"cannot start srun: {e.strerror}")
                started.runs.append(run)
            return started
        step = Step(proc, hostfile, len(specs))
        self.steps.append(step)
        by_task: dict[str, dict[int, Stream]] = {"out": {}, "err": {}}
        for task, spec in enumerate(specs):
            run = RankRun(spec, proc, StepControl(step, task))
            started.runs.append(run)
            for name in ("out", "err"):
                by_task[name][task] = Stream(run, name, None)
        assert proc.stdout is not None and proc.stderr is not None
        for name, pipe in (("out", proc.stdout), ("err", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            source = StepStream(name, pipe.fileno(), by_task[name])
            self.sources.append(source)
            started.sources.append(source)
        return started

    def ended(self, run: RankRun, now: float) -> RankStatus | None:
        if run.reported is not None:
            # Its agent said how the rank ended; the step's srun runs on for the other ranks.
            return RankStatus(run.reported.get("code"), run.reported.get("signal"), run.reported.get("error"))
        if run.proc is None or run.proc.poll() is None:
            return None
        if run.exited_at is None:
            run.exited_at = now
        if any(s.open for s in run.streams) and now - run.exited_at < 2.0:
            return None
        code = run.proc.returncode
        return RankStatus(code if code >= 0 else None, -code if code < 0 else None,
                          f"its task of the srun step ended without reporting the rank's status (srun's exit status {code})")

    def unreachable(self, run: RankRun) -> bool:
        # Its agent was told to stop its rank and did not (the step asks for --no-kill, so srun does
        # not end it where a node is lost): the node or the link to it is gone.
        return True

    def close(self, runs: Sequence[RankRun], grace: float) -> list[tuple[str, Read]]:
        """srun ends once its tasks have; one that outlives the job is killed (its agents then see
        their stdin close and stop their ranks). What srun passed on after the last rank's exit
        report (its last lines) comes back, to be shown."""
        if not self.steps:
            return []
        for step in self.steps:
            step.close()
        for step in self.steps:
            try:
                step.proc.wait(timeout=grace + 5.0)
            except subprocess.TimeoutExpired:
                step.proc.kill()
                step.proc.wait()
        reads = []
        deadline = time.monotonic() + 2.0
        for source in self.sources:
            while source.open and time.monotonic() < deadline:
                got = source.read()
                if got is not None:
                    reads.append((source.name, got))
            source.open = False
        for step in self.steps:
            for pipe in (step.proc.stdout, step.proc.stderr):
                if pipe is not None:
                    pipe.close()
            with contextlib.suppress(OSError):
                os.unlink(step.hostfile)
        return reads

    def query(self, hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float) -> Answers:
        return query_step(hosts, make_request, timeout)


def query_step(
    hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float
) -> list[tuple[Host, Any, LaunchError | None]]:
    """`query_host` on every host at once, as the tasks of one srun step (one task per host). Where
    the step reached only some of them (a node lost: srun launches on all or none), each host it
    missed is asked again in a step of its own, so that the others still answer (the tidy-up after
    an elastic job that lost a node)."""
    results, reached = _query_together(hosts, make_request, timeout)
    if len(hosts) > 1 and not all(reached):
        for i, host in enumerate(hosts):
            if not reached[i]:
                results[i] = _query_together([host], make_request, timeout)[0][0]
    return results


def _query_together(
    hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float
) -> tuple[list[tuple[Host, Any, LaunchError | None]], list[bool]]:
    """One srun step's answers, and which hosts answered at all."""
    requests = [make_request(h) for h in hosts]
    hostfile = write_slurm_hostfile([h.name for h in hosts])
    argv = slurm.query_argv(len(hosts), srun_program())
    try:
        proc = start_step(argv, hostfile, step_request([{**r, "rank": i} for i, r in enumerate(requests)]))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            late = [(h, None, LaunchError(f"srun did not answer for host {h.name} within {timeout:g} s")) for h in hosts]
            return late, [True] * len(hosts)  # asking again would wait as long
    except OSError as e:
        return [(h, None, LaunchError(f"cannot run srun: {e.strerror}")) for h in hosts], [True] * len(hosts)
    finally:
        os.unlink(hostfile)
    answers: dict[int, Any] = {}
    for line in out.splitlines():
        labelled = slurm.split_label(line)
        if labelled is None:
            continue
        with contextlib.suppress(ValueError):
            answers[labelled[0]] = json.loads(labelled[1])
    errors = err.decode(errors="replace").strip().splitlines()
    results: list[tuple[Host, Any, LaunchError | None]] = []
    for i, host in enumerate(hosts):
        if i not in answers:
            reason = errors[-1] if errors else f"srun's exit status {proc.returncode}"
            results.append((host, None, LaunchError(f"cannot reach node {host.name} with srun: {reason}")))
        elif isinstance(answers[i], dict) and "error" in answers[i]:
            results.append((host, None, LaunchError(f"host {host.name}: {answers[i]['error']}")))
        else:
            results.append((host, answers[i], None))
    return results, [i in answers for i in range(len(hosts))]
