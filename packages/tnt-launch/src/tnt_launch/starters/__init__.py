"""The ways ranks start, behind one interface the supervisor uses (`RankStarter`): agents started
here (`local.py`), agents over ssh (`ssh.py`), and the tasks of one srun step (`srun.py`). Each also
answers the questions a host must answer before and after a job (probe, tidy-up), in its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tnt_launch.agents import SshSettings
from tnt_launch.config import LaunchError
from tnt_launch.hosts import Host
from tnt_launch.plan import RankSpec
from tnt_launch.rank_run import RankRun, RankStatus, Read, Source

Answers = list[tuple[Host, Any, LaunchError | None]]
"""What each host said to a query, in host order: (host, its answer, or the error in reaching it)."""


@dataclass
class Started:
    """What a starter started: the runs (one that could not start has its status already), the
    pipes to watch, and the specs it holds back for later (ssh: too many connecting to one host)."""

    runs: list[RankRun] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    later: list[RankSpec] = field(default_factory=list)


class RankStarter(Protocol):
    """One way of starting ranks, as the supervisor (supervise.py) uses it."""

    def start(self, specs: Sequence[RankSpec], request: Callable[[RankSpec], dict[str, Any]],
              runs: Sequence[RankRun]) -> Started:
        """Starts what may start now of `specs`, each told `request(spec)`; `runs` are the job's
        runs so far."""
        ...

    def ended(self, run: RankRun, now: float) -> RankStatus | None:
        """How `run` ended, once it has and its output has arrived; None while it runs."""
        ...

    def unreachable(self, run: RankRun) -> bool:
        """Whether an agent that did not answer whether its rank is stopped sits behind a cut link
        or on a dead host (and so is dropped, not stopped)."""
        ...

    def close(self, runs: Sequence[RankRun], grace: float) -> list[tuple[str, Read]]:
        """After the job: lets go of what it started; the output that came after, with the name of
        the source it came from ("out", "err")."""
        ...

    def query(self, hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float) -> Answers:
        """Asks every host of `hosts` something (a probe, a tidy-up) through an agent."""
        ...


class Ways(dict[str, RankStarter]):
    """The starters of one job, by the name each rank's spec gives (`RankSpec.way`): "srun" alone
    inside an allocation that srun starts, else "local" and "ssh". They also answer for the job's
    hosts before and after it."""

    def __init__(self, launcher: str, starters: Mapping[str, RankStarter]) -> None:
        super().__init__(starters)
        self.launcher = launcher

    def query(self, hosts: Sequence[Host], make_request: Callable[[Host], dict[str, Any]], timeout: float) -> Answers:
        """Asks every host of `hosts` something, the way the job's ranks start there: this host in
        this process, others over ssh, or every node through one srun step."""
        if "srun" in self:
            return self["srun"].query(hosts, make_request, timeout)
        answers: dict[Host, tuple[Host, Any, LaunchError | None]] = {}
        for way, local in (("local", True), ("ssh", False)):
            some = [h for h in hosts if h.local == local]
            if some:
                answers.update(zip(some, self[way].query(some, make_request, timeout)))
        return [answers[h] for h in hosts]

    def query_here(self, make_request: Callable[[Host], dict[str, Any]], timeout: float) -> Answers:
        """Asks this host, in this process (it holds the launcher's own registry entry)."""
        from tnt_launch.starters.local import LocalAgents

        return LocalAgents().query([Host("localhost", local=True)], make_request, timeout)


def for_launcher(launcher: str, ssh: SshSettings, cpus_per_task: int | None = None, elastic: bool = False) -> Ways:
    """The starters of a job whose placement chose `launcher` (hosts.LAUNCHERS); `cpus_per_task`
    is srun's, from the allocation; `elastic`: the job goes on after losing ranks (--elastic)."""
    from tnt_launch.starters import local, srun
    from tnt_launch.starters import ssh as over_ssh

    if launcher == "srun":
        return Ways(launcher, {"srun": srun.SrunStep(cpus_per_task, no_kill=elastic)})
    return Ways(launcher, {"local": local.LocalAgents(ssh), "ssh": over_ssh.SshAgents(ssh)})
