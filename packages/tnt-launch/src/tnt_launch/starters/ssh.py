"""Ranks started on other hosts: one agent per rank, reached over ssh (`agents.ssh_argv`), otherwise
as on this host (`local.py`): its ssh session's stdout and stderr are the rank's, its stdin the
supervisor's requests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tnt_launch.hosts import Host
from tnt_launch.plan import RankSpec
from tnt_launch.rank_run import RankRun, RankStatus
from tnt_launch.starters import Started
from tnt_launch.starters.local import LocalAgents

STARTS_PER_HOST = 8
"""Agents started over ssh to one host that may be connecting at once: fewer than OpenSSH's
default MaxStartups (10), beyond which sshd drops new connections at random."""


class SshAgents(LocalAgents):
    """Starts each rank's agent over ssh, at most STARTS_PER_HOST connecting to one host at once."""

    def host(self, spec: RankSpec) -> Host:
        return Host(spec.host, local=False)

    def start(self, specs: Sequence[RankSpec], request: Callable[[RankSpec], dict[str, Any]],
              runs: Sequence[RankRun]) -> Started:
        connecting: dict[str, int] = {}
        for run in runs:
            if not run.spec.local and run.running and not run.ready:
                connecting[run.spec.host] = connecting.get(run.spec.host, 0) + 1
        now, later = [], []
        for spec in specs:
            if connecting.get(spec.host, 0) >= STARTS_PER_HOST:
                later.append(spec)
                continue
            connecting[spec.host] = connecting.get(spec.host, 0) + 1
            now.append(spec)
        started = super().start(now, request, runs)
        started.later = later
        return started

    def status(self, run: RankRun) -> RankStatus:
        if run.reported is None and run.proc is not None and run.proc.returncode == 255:
            last = run.tail[-1] if run.tail else "no message"
            return RankStatus(255, error=f"ssh to {run.spec.host} failed: {last}")
        return super().status(run)

    def unreachable(self, run: RankRun) -> bool:
        # Its agent was asked and said nothing: the host or the link to it is gone, and a stop
        # request would wait out the grace period for nothing.
        return True
