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

# The kinds of tnt-comm's failures (tnt_comm.error_data's "kind"): a rank that reports one failed because
# of another rank (dead, stalled or disagreeing), not of its own accord.
FATAL_KINDS = ("Timeout", "PeerFailure", "CollectiveMismatch")
HEADLINE_CHARS = 300  # of an exception's message in the summary's lines (its traceback follows)
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
    error_at: float | None
    heard_at: float | None
    stopped_by_us: bool
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


def is_fatal(error: dict[str, Any] | None) -> bool:
    return error is not None and error.get("kind") in FATAL_KINDS


def _blamed_others(run: Run) -> list[int]:
    error = run.error or {}
    return [r for r in error.get("ranks") or [] if isinstance(r, int) and r != run.spec.rank]


def is_consequence(run: Run) -> bool:
    """Whether the error ``run`` reported follows from other ranks' failures: one of tnt-comm's
    failures, or an error that names other ranks to blame and not its own rank (tnt-keras' shared
    outcome of a failed save, raised on the ranks whose own write went well)."""
    if run.error is None:
        return False
    if is_fatal(run.error):
        return True
    ranks = run.error.get("ranks") or []
    return bool(ranks) and run.spec.rank not in ranks


def leads(run: Run) -> list[int]:
    """The ranks whose failure ``run``'s reported error follows from (see ``is_consequence``)."""
    return _blamed_others(run) if is_consequence(run) else []


def awaited(run: Run) -> list[int]:
    """The ranks whose own report or exit the summary waits a moment for, since ``run``'s error says
    they are leaving: a dead peer, or a rank whose failure was shared. Not the ranks a timeout
    names: they made no progress and may never report."""
    if run.error is None or run.error.get("kind") in ("Timeout", "CollectiveMismatch"):
        return []
    return leads(run)


def own_failure(run: Run) -> bool:
    """Whether ``run`` failed of its own accord: it reported an error that does not follow from other
    ranks' (see ``is_consequence``), or it exited non-zero or was killed, without a report, before
    tnt-launch began to stop the job."""
    if run.error is not None:
        return not is_consequence(run)
    status = run.status
    return status is not None and not status.ok and not run.stopped_by_us


def headline(error: dict[str, Any]) -> str:
    """'ValueError: its message' (its first line, cut short) of a reported error."""
    kind = str(error.get("kind") or "an error")
    lines = str(error.get("message") or "").strip().splitlines()
    text = lines[0] if lines else ""
    if len(text) > HEADLINE_CHARS or len(lines) > 1:
        text = text[:HEADLINE_CHARS] + " ..."
    return f"{kind}: {text}" if text else kind


def describe_failure(run: Run, stopping: bool) -> str:
    """How ``run`` ended, for the summary."""
    assert run.status is not None
    status = run.status
    cut_short = run.error is not None and status.signal is not None and run.stopped_by_us
    if run.error is not None and not is_consequence(run):
        # Its own exception, as it reported it; its traceback follows in the summary.
        if cut_short:
            how = "stopped by tnt-launch while exiting"
        elif status.error is None and status.signal is None:
            how = f"exit code {status.code}"
        else:
            how = status.describe()
        return f"raised {headline(run.error)} ({how})"
    if cut_short and stopping:
        # Stopped by us while it was exiting with the error it printed.
        what = "timed out" if timed_out(run.error) else f"failed with {headline(run.error or {})}"
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


def culprit(first: Run, runs: Sequence[Run]) -> Run:
    """The rank whose own failure came first in cause, whatever order the exits reached tnt-launch
    in: from ``first`` (the first failure heard of), follow the ranks that each consequence blames
    (a dead peer, a rank whose failed save was shared) to a rank that failed of its own accord (see
    ``own_failure``). Where that chain ends nowhere, the own failure heard of first; where there is
    none, ``first``."""
    by_rank = {run.spec.rank: run for run in runs}
    run, seen = first, {first.spec.rank}
    while not own_failure(run):
        named = [by_rank[r] for r in leads(run) if r in by_rank and r not in seen]
        step = next((r for r in named if own_failure(r)), None) or next(
            (r for r in named if r.error is not None), None
        )
        if step is None:
            break
        run = step
        seen.add(run.spec.rank)
    if own_failure(run):
        return run
    owners = [r for r in runs if own_failure(r)]
    return min(owners, key=lambda r: r.heard_at if r.heard_at is not None else float("inf")) if owners else first
