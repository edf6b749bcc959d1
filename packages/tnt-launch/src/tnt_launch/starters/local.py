"""Ranks started on this host: one agent per rank (`_agent.py`), a child of tnt-launch, whose stdout
and stderr are the rank's and whose stdin carries the supervisor's requests ('S', 'T', 'K', 'U')."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from tnt_launch import agents
from tnt_launch.agents import SshSettings
from tnt_launch.hosts import Host
from tnt_launch.plan import RankSpec
from tnt_launch.rank_run import RankRun, RankStatus, Read, Stream, read_available, signal_name
from tnt_launch.starters import Answers, Started

DRAIN_S = 2.0
"""How long an agent's pipes may stay open after it exited (something the rank left holds them)."""


class AgentControl:
    """An agent's stdin: the supervisor's requests go there, and closing it stops the rank."""

    def __init__(self, proc: subprocess.Popen[bytes], local: bool) -> None:
        self.proc = proc
        self.local = local

    def send(self, command: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.write(command)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def finished(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def kill(self) -> None:
        """Kill the agent, and where it runs here everything under it."""
        if self.proc.poll() is not None:
            return
        targets = []
        if self.local:
            with contextlib.suppress(psutil.Error):
                targets = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        for child in targets:
            with contextlib.suppress(psutil.Error):
                child.kill()


class AgentPipe:
    """An agent's stdout or stderr, which is its rank's."""

    def __init__(self, stream: Stream) -> None:
        assert stream.fd is not None
        self.stream = stream
        self.fd = stream.fd
        self.name = stream.name

    def read(self) -> Read | None:
        data = read_available(self.fd)
        if data is None:
            return None
        return Read([(self.stream, data)]) if data else Read(ended=[self.stream])


class LocalAgents:
    """Starts each rank's agent as a child process of tnt-launch, in a session of its own."""

    def __init__(self, ssh: SshSettings | None = None) -> None:
        self.ssh = ssh or SshSettings()

    def host(self, spec: RankSpec) -> Host:
        return Host(spec.host, local=True)

    def start(self, specs: Sequence[RankSpec], request: Callable[[RankSpec], dict[str, Any]],
              runs: Sequence[RankRun]) -> Started:
        started = Started()
        for spec in specs:
            run, sources = self.start_one(spec, request(spec))
            started.runs.append(run)
            started.sources += sources
        return started

    def start_one(self, spec: RankSpec, request: dict[str, Any]) -> tuple[RankRun, list[AgentPipe]]:
        host = self.host(spec)
        try:
            proc = agents.start_agent(host, self.ssh, request)
        except OSError as e:
            run = RankRun(spec, None)
            run.status = RankStatus(127, error=f"cannot start its agent: {e.strerror}")
            return run, []
        run = RankRun(spec, proc, AgentControl(proc, host.local))
        assert proc.stdout is not None and proc.stderr is not None
        pipes = []
        for name, pipe in (("out", proc.stdout), ("err", proc.stderr)):
            pipes.append(AgentPipe(Stream(run, name, pipe.fileno())))
        return run, pipes

    def ended(self, run: RankRun, now: float) -> RankStatus | None:
        if run.proc is None or run.proc.poll() is None:
            return None
        if run.exited_at is None:
            run.exited_at = now
        # Wait for the pipes to drain, unless something the rank left holds them open.
        if any(s.open for s in run.streams) and now - run.exited_at < DRAIN_S:
            return None
        return self.status(run)

    def status(self, run: RankRun) -> RankStatus:
        reported = run.reported
        if reported is not None:
            return RankStatus(reported.get("code"), reported.get("signal"), reported.get("error"))
        assert run.proc is not None
        code = run.proc.returncode
        if code < 0:
            return RankStatus(None, -code, f"its agent was killed by {signal_name(-code)}")
        return RankStatus(code, error="its agent ended without reporting the rank's status")

    def unreachable(self, run: RankRun) -> bool:
        return False

    def close(self, runs: Sequence[RankRun], grace: float) -> list[tuple[str, Read]]:
        for run in runs:
            if run.proc is None:
                continue
            for pipe in (run.proc.stdout, run.proc.stderr):
                if pipe is not None:
                    pipe.close()
            if run.proc.poll() is None:
                run.kill()
                run.proc.wait()
        return []

    def query(self, hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float) -> Answers:
        return agents.query_hosts(hosts, self.ssh, make_request, timeout)
