"""Who to blame when a job fails, from what the ranks and their agents reported.

Three sources, all data: each rank's exit status, the error it ends with as tnt-comm reports it
(``tnt_comm.error_data``: the kind and the ranks it blames, relayed by the agent), and the agent's
answer to whether the rank's processes are stopped. No sentence of tnt-comm's is parsed. The
supervisor (supervise.py) collects these; this module turns them into the summary's verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tnt_launch.plan import Plan, RankSpec

# The kinds of tnt-comm's failures (tnt_comm.error_data's "kind") after which a rank is about to exit.
FATAL_KINDS = ("Timeout", "PeerFailure", "CollectiveMismatch")
STOPPED_REASON = "process stopped, e.g. by SIGSTOP or a debugger"


class Status(Protocol):
    signal: int | None
    error: str | None

    def describe(self) -> str: ...


class Run(Protocol):
    """What the verdict reads of one rank's run (rank_run.RankRun)."""

    spec: RankSpec
    status: Status | None
    state: dict[str, Any] | None
    error: dict[str, Any] | None
    fatal_at: float | None
    failed_on_its_own: bool


def ranks_text(numbers: Sequence[int]) -> str:
    return ", ".join(f"rank {n}" for n in numbers)


def blamed(error: dict[str, Any] | None, kind: str) -> list[int]:
    """The ranks a reported error of ``kind`` blames."""
    if error is None or error.get("kind") != kind:
        return []
    return [r for r in error.get("ranks") or [] if isinstance(r, int)]


def timed_out(error: dict[str, Any] | None) -> bool:
    return error is not None and error.get("kind") == "Timeout"


def named_no_progress(error: dict[str, Any] | None) -> list[int]:
    """The ranks a timeout in a collective blames: those that made no progress in it (a start that
    timed out blames the ranks that did not arrive: not this)."""
    return blamed(error, "Timeout") if error and error.get("operation") else []


def named_dead(error: dict[str, Any] | None) -> int | None:
    """The rank whose death a PeerFailure reports."""
    ranks = blamed(error, "PeerFailure")
    return ranks[0] if ranks else None


def is_fatal(error: dict[str, Any] | None) -> bool:
    return error is not None and error.get("kind") in FATAL_KINDS


def describe_failure(run: Run, stopping: bool) -> str:
    """How ``run`` ended, for the summary."""
    assert run.status is not None
    status = run.status
    if run.fatal_at is not None and status.signal is not None and stopping:
        # Stopped by us while it was exiting with the error it printed.
        what = "timed out" if timed_out(run.error) else "failed with a tnt-comm error"
        return f"{what} (stopped by tnt-launch while exiting)"
    text = status.describe()
    if timed_out(run.error) and status.error is None and status.signal is None:
        text += " after timing out"
    return text


def no_progress(runs: Sequence[Run], size: int) -> list[tuple[list[int], str]]:
    """Ranks that made no progress, grouped by how that is known: stopped processes first, then the
    ranks that the failed ranks' timeout reports name."""
    stopped = [r.spec.rank for r in runs if r.state and r.state.get("stopped")]
    named: dict[int, list[int]] = {}
    for run in runs:
        if not run.failed_on_its_own:
            continue
        for rank in named_no_progress(run.error):
            if rank not in stopped and rank != run.spec.rank and 0 <= rank < size:
                named.setdefault(rank, []).append(run.spec.rank)
    groups: list[tuple[list[int], str]] = []
    if stopped:
        groups.append((stopped, STOPPED_REASON))
    by_reporters: dict[tuple[int, ...], list[int]] = {}
    for rank, reporters in named.items():
        by_reporters.setdefault(tuple(reporters), []).append(rank)
    for reporters, ranks in by_reporters.items():
        messages = "message" if len(reporters) == 1 else "messages"
        groups.append((sorted(ranks), f"named by the timeout {messages} of {ranks_text(reporters)}"))
    return groups


def on_hosts(plan: Plan, ranks: Sequence[int]) -> str:
    """' on host H' (or ' on hosts H1, H2') for a job on several hosts; '' on one host."""
    if len(plan.hosts) < 2:
        return ""
    by_rank = {spec.rank: spec.host for spec in plan.ranks}
    hosts = list(dict.fromkeys(by_rank[r] for r in ranks if r in by_rank))
    return f" on host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)}" if hosts else ""


def stopped_processes(run: Run) -> str:
    """'made no progress: stopped process(es) PID (stopped), ...' of a rank whose agent said so."""
    assert run.state is not None
    letters = {"T": "stopped", "t": "stopped by a tracer"}
    processes = ", ".join(f"{pid} ({letters.get(str(state), state)})" for pid, state in run.state["stopped"])
    return f"made no progress: stopped process(es) {processes}"


def culprit(failure: Run, runs: Sequence[Run]) -> Run:
    """The rank whose death ``failure``'s PeerFailure names, where that rank failed on its own, else
    ``failure``: the exits of ranks on different hosts reach tnt-launch in any order, and a survivor
    that saw the dead rank's connection close may be heard of first."""
    named = named_dead(failure.error)
    if named is None:
        return failure
    dead = next((r for r in runs if r.spec.rank == named), None)
    if dead is None or dead is failure or not dead.failed_on_its_own or dead.status is None:
        return failure
    return dead
