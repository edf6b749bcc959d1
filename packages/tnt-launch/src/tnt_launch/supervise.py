"""Running a planned job: output streaming, failure propagation, signals, and the final summary.

The ranks start the way the plan says (`starters/`: agents here, over ssh, or one srun step); one
thread watches what they write, through a selector. The first rank that exits non-zero, dies
by a signal or reports the error it is exiting with brings the job down. First every agent whose
rank still runs is asked which of its rank's processes are stopped (SIGSTOP, a debugger): such a
rank made no progress, and is most likely why the others timed out. Meanwhile the ranks that the
failures heard so far blame as leaving (a dead peer) get a moment to report their own error or
exit. Then every other agent is told to stop its rank (SIGTERM and SIGCONT, then SIGKILL after the
grace period), and tnt-launch exits with the culprit's status after printing a summary. The culprit
is the rank whose own failure came first in cause, not in exit order (blame.culprit). The summary
names first the ranks that made no progress, the stopped ones and those that the failed ranks'
tnt-comm timeout messages name ("made no progress: rank 1, rank 3"), then the culprit. SIGINT
(Ctrl+C), SIGTERM and SIGHUP to tnt-launch stop the job the same way; a second one kills the ranks at once. SIGUSR1 is passed on to every rank (a preemption
warning). An agent on another host that does not answer that question in time sits behind a cut
link or on a dead host: its connection is dropped at once instead of waiting out the grace period,
and the summary names the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

from tnt_launch import blame, contract, jobs, quiet
from tnt_launch.config import LaunchConfig
from tnt_launch.plan import Plan, RankSpec
from tnt_launch.rank_run import (
    Fed,
    Output,
    RankRun,
    RankStatus,
    Read,
    Source,
    Stream,
    signal_name,
)
from tnt_launch.starters import RankStarter
from tnt_launch.store import ElasticStore

_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
STATE_WAIT_S = 3.0
"""How long a failing job waits for its agents to say whether their ranks are stopped (an ssh
round trip), and for the ranks that failures blame as leaving to report or exit, before it stops
them anyway."""
# After a rank reports the error it ends with it is about to exit, but TensorFlow's teardown can take
# seconds: the job starts failing FATAL_GRACE_S after such a report even while the rank still runs.
FATAL_GRACE_S = 1.0
# A rank an elastic job re-formed without is most often dead, its exit not heard yet: it is told to
# stop (and named as left out) only if it still runs this long after.
LEFT_OUT_S = 2.0
_ranks = blame.ranks_text


def left_out_of(generation: int, members: list[int], ranks: list[int], joiners: Mapping[int, int | None]) -> list[int]:
    """Those of `ranks` that `generation` re-formed the job without. A replacement (a key of `joiners`,
    which maps it to the generation that admitted it, None while it waits) counts only from its
    admission on: decisions are read in batches, and one that came before its admission is no sign
    that it was left out."""
    out = []
    for rank in ranks:
        if rank in joiners and (joiners[rank] is None or joiners[rank] > generation):
            continue
        if rank not in members:
            out.append(rank)
    return out


class Supervisor:
    """Starts the ranks of `plan` with `starters` (by each spec's way) and watches them until
    the job has ended."""

    def __init__(
        self,
        plan: Plan,
        config: LaunchConfig,
        starters: Mapping[str, RankStarter],
        out: BinaryIO | None = None,
        err: BinaryIO | None = None,
        grace: float = jobs.GRACE_S,
        store: ElasticStore | None = None,
    ) -> None:
        self.plan = plan
        self.store = store
        """An elastic job's store (--elastic), where lost ranks are marked; None: not elastic."""
        self.lost: list[RankRun] = []
        """Ranks of an elastic job that ended with a failure, or were left out, while enough others went on."""
        self.joining: list[RankRun] = []
        """Replacement ranks of an elastic job (--elastic MIN:MAX), each joining as a new member."""
        self.unneeded: list[RankRun] = []
        """Replacements stopped because the job ended before it admitted them."""
        self.next_member = len(plan.ranks)  # replacements get new member ids, after the first ranks'
        self.spares_taken: set[tuple[str, int]] = set()  # slots of spare hosts given to replacements
        self.left_out: dict[int, tuple[float, int, list[int]]] = {}
        """Ranks an elastic job re-formed without while they still ran: when that was heard, and the
        generation (number, members) that left them out."""
        self.config = config
        self.starters = starters
        self.output = Output(out or sys.stdout.buffer, err or sys.stderr.buffer)
        self.grace = grace
        self.runs: list[RankRun] = []
        self.pending: list[RankSpec] = []
        self.selector = selectors.DefaultSelector()
        self.first_failure: RankRun | None = None
        self.received_signal: int | None = None
        self.stopping = False
        self.kill_at: float | None = None
        self.abandon_at: float | None = None
        self.abandoned: list[RankRun] = []
        self.check_until: float | None = None
        """While the agents are asked whether their ranks are stopped: when to stop waiting."""
        self.silent: list[RankRun] = []
        """Runs on other hosts whose agents did not answer in time: dropped, not stopped."""
        self._pending_signals: list[int] = []
        self._wakeup: tuple[int, int] | None = None

    # -- messages ---------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        self.output.write("err", f"tnt-launch: {text}\n".encode())

    def _where(self, run: RankRun) -> str:
        spec = run.spec
        return f"rank {spec.rank} (host {spec.host}, local rank {spec.local_rank})"

    # -- starting ---------------------------------------------------------------------------

    def _starter(self, run: RankRun) -> RankStarter:
        return self.starters[run.spec.way]

    def _request(self, spec: RankSpec) -> dict[str, Any]:
        return self.plan.rank_request(spec, self.grace)

    def _start_pending(self) -> None:
        """Start the ranks not started yet, as far as their starters let them now."""
        if self.stopping or self.first_failure is not None:
            # A failed job starts nothing more.
            self.pending = []
            return
        by_way: dict[str, list[RankSpec]] = {}
        for spec in self.pending:
            by_way.setdefault(spec.way, []).append(spec)
        self.pending = []
        for way, specs in by_way.items():
            self._handle_signals()
            if self.stopping:
                return
            started = self.starters[way].start(specs, self._request, self.runs)
            self.pending += started.later
            for source in started.sources:
                os.set_blocking(source.fd, False)
                self.selector.register(source.fd, selectors.EVENT_READ, source)
            for run in started.runs:
                self._add(run)

    def _add(self, run: RankRun) -> None:
        self.runs.append(run)
        if contract.JOIN in run.spec.env:
            self.joining.append(run)
        if self.config.output_dir is not None:
            for stream, suffix in (("out", "out"), ("err", "err")):
                path = os.path.join(self.config.output_dir, f"rank-{run.spec.rank}.{suffix}")
                run.files[stream] = open(path, "wb")  # noqa: SIM115 - closed when the stream ends
        for stream in run.streams:
            if stream.name == "err" and self.plan.hide_tf_startup:
                stream.startup_filter = quiet.StartupFilter()
        if run.status is not None:  # it could not start
            self._finish(run, run.status)

    # -- output -----------------------------------------------------------------------------

    def _live(self, run: RankRun) -> bool:
        """Whether `run`'s output is shown as it comes: every rank's with --output-on-all-devices,
        else rank 0's, which in an elastic job that lost it is a survivor's (asked at every chunk:
        the new rank 0 may write before this loop has read the decision that made it so)."""
        if self.config.output_on_all_devices:
            return True
        return run.spec.rank == (self.store.first_member() if self.store is not None else 0)

    def _prefix(self, run: RankRun) -> bytes:
        return f"[rank {run.spec.rank}] ".encode()

    def _on_data(self, stream: Stream, data: bytes) -> None:
        self._on_fed(stream, stream.feed(data, whole_lines=self.config.output_on_all_devices))

    def _on_fed(self, stream: Stream, fed: Fed) -> None:
        run = stream.run
        for message in fed.messages:
            self._on_message(run, message)
        if fed.data:
            if stream.name in run.files:
                run.files[stream.name].write(fed.data)
            if self._live(run) and not self.config.output_on_all_devices:
                # Passed on as it comes, so progress bars and prompts show at once.
                self.output.write(stream.name, fed.data)
        for line in fed.lines:
            self._on_line(stream, line)

    def _on_line(self, stream: Stream, line: bytes) -> None:
        run = stream.run
        if stream.name == "err":
            # Of a line redrawn with carriage returns (a progress bar) keep the last state.
            text = line.decode(errors="replace").rstrip("\n").rstrip("\r")
            run.tail.append(text.rsplit("\r", 1)[-1])
        if self.config.output_on_all_devices:
            self.output.write(stream.name, self._prefix(run) + line)

    def _on_message(self, run: RankRun, payload: bytes) -> None:
        try:
            message = json.loads(payload.decode(errors="replace"))
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("event") == "ready":
            run.ready = True
        elif message.get("event") == "exit":
            run.reported = message
            run.ended_before_stop = not self.stopping
        elif message.get("event") == "error" and isinstance(message.get("error"), dict) and run.error is None:
            run.error = message["error"]
            run.error_at = time.monotonic()
            if run.heard_at is None:
                run.heard_at = run.error_at
        elif message.get("event") == "printed":
            run.printed = True
        elif message.get("event") == "state":
            run.state = message

    def _read(self, source: Source) -> None:
        got = source.read()
        if got is not None:
            self._take(source.name, got)

    def _take(self, name: str, got: Read) -> None:
        """Hands what a source read to the streams (and tnt-launch's own output: srun's words)."""
        for stream, data in got.data:
            if stream is None:
                self.output.write(name, data)
            elif stream.open:
                self._on_data(stream, data)
        for stream in got.ended or ():
            self._close_stream(stream)

    def _unwatch(self, fd: int | None) -> None:
        if fd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(fd)

    def _close_stream(self, stream: Stream) -> None:
        if not stream.open:
            return
        self._on_fed(stream, stream.end(whole_lines=self.config.output_on_all_devices))
        self._unwatch(stream.fd)
        file = stream.run.files.pop(stream.name, None)
        if file is not None:
            file.close()

    # -- exits ------------------------------------------------------------------------------

    def _poll_exits(self) -> None:
        now = time.monotonic()
        for run in self.runs:
            if not run.running:
                continue
            status = self._starter(run).ended(run, now)
            if status is None:
                continue
            for stream in run.streams:
                if stream.fd is not None:  # a pipe of its own ends with it; an srun step's lines go on
                    self._close_stream(stream)
            self._finish(run, status)

    def _finish(self, run: RankRun, status: RankStatus) -> None:
        run.status = status
        # Its agent may have said how it ended before the stop began, and we heard of its exit after.
        run.stopped_by_us = self.stopping and not run.ended_before_stop
        run.close_stdin()
        # A rank that reported the error it ends with failed on its own, even if the job was being
        # stopped (because of that report, or of its peers') when it exited.
        if status.ok or (run.stopped_by_us and run.error is None):
            return
        run.failed_on_its_own = True
        if run.heard_at is None:
            run.heard_at = time.monotonic()
        if run in self.lost or run in self.unneeded or (self.first_failure is None and self._goes_on_without(run)):
            return
        if self.first_failure is None:
            self.first_failure = run
            self._check_states()

    def _goes_on_without(self, run: RankRun) -> bool:
        """An elastic job that still has enough ranks loses `run` and goes on: the store says so, so
        that the survivors, which re-form the job there, need not wait for every one to notice."""
        config = self.config
        if self.store is None or config.elastic_min is None or self.stopping:
            return False
        # Replacements still waiting to be admitted cannot carry the job on.
        left = self._ranks_left()
        if left < config.elastic_min:
            return False
        self.lost.append(run)
        how = self._describe_failure(run)
        self.store.mark_lost(run.spec.rank, f"tnt-launch saw it end: {how}")
        self._say(f"{self._where(run)} is lost: it {how}; the job goes on with {left} rank(s) (--elastic {config.elastic_min})")
        self._replace(run, left)
        return True

    def _replace(self, run: RankRun, left: int) -> None:
        """Starts a replacement for `run` (--elastic MIN:MAX), as a new member that the job admits
        at its next epoch, while MAX ranks and --max-restarts replacements allow it: on `run`'s host,
        or where that host is gone (its agent stopped answering, or its connection ended without a
        word), on a free slot of a spare host: of the hostfile, or a node of the Slurm allocation
        that the job's ranks leave empty."""
        config = self.config
        started = len(self.joining) + sum(1 for spec in self.pending if contract.JOIN in spec.env)
        if config.elastic_max is None or left >= config.elastic_max or started >= config.max_restarts:
            return
        place, why = run.spec, ""
        if self._host_gone(run):
            free = [s for s in self.plan.spares if (s.host, s.local_rank) not in self.spares_taken]
            if not free:
                self._say(f"no replacement for rank {run.spec.rank}: its host {run.spec.host} is gone and no "
                          "spare host (of the hostfile, or a node of the Slurm allocation without ranks) has a free slot")
                return
            place = free[0]
            self.spares_taken.add((place.host, place.local_rank))
            why = f" (a spare host: host {run.spec.host} is gone)"
        member = self.next_member
        self.next_member += 1
        # The rank it stands in for names its output and files (TNT_RANK); the job gives it its rank.
        env = {**place.env, contract.RANK: run.spec.env[contract.RANK], contract.JOIN: str(member),
               contract.STDOUT_TTY: run.spec.env.get(contract.STDOUT_TTY, "false")}
        self.pending.append(dataclasses.replace(place, rank=member, env=env))
        self._say(f"starting rank {member} on host {place.host}{why} in place of rank {run.spec.rank} "
                  f"(replacement {started + 1} of at most {config.max_restarts}); it joins when the job next admits replacements")

    def _host_gone(self, run: RankRun) -> bool:
        """Whether `run`'s host cannot take a replacement: its agents stopped answering, or `run`'s
        agent on another host ended without reporting how the rank did (its connection cut)."""
        if run.spec.host in self.silent_hosts:
            return True
        return run.spec.way == "ssh" and run.reported is None and run.proc is not None and run.proc.poll() is not None

    def _ranks_left(self) -> int:
        """The ranks that carry the job on: running members, and those about to start (not joiners)."""
        waiting = self._waiting_to_join()
        left = sum(1 for r in self.runs if r.running and r not in waiting)
        return left + sum(1 for spec in self.pending if contract.JOIN not in spec.env)

    def _check_generations(self, now: float) -> None:
        """Stops the ranks an elastic job re-formed without while they still run (a stopped rank, a
        host behind a cut link): they are out of the job. A rank that was left out because it died
        ends within LEFT_OUT_S, and is lost as any rank that ends; one still running then is told to
        stop, and an agent that cannot be reached is dropped after the grace period, its host named
        in the summary."""
        if self.store is None:
            return
        self._stop_unneeded_joiners()
        store = self.store
        decisions = store.take_decisions()
        admitted = {r.spec.rank: store.admitted_in(r.spec.rank) for r in self.joining} if decisions else {}
        for generation, members in decisions:
            running = [r.spec.rank for r in self.runs if r.running and r.spec.rank not in self.left_out]
            for rank in left_out_of(generation, members, running, admitted):
                self.left_out[rank] = (now, generation, members)
        for run in self.runs:
            left = self.left_out.get(run.spec.rank)
            if left is None or not run.running:
                continue
            seen, generation, members = left
            if run not in self.lost and now - seen >= LEFT_OUT_S:
                self.lost.append(run)
                self._say(f"{self._where(run)} is left out of the job, which re-formed without it "
                          f"(generation {generation}: {_ranks(members)}); stopping it")
                run.send(b"T")
            elif run in self.lost and now - seen > LEFT_OUT_S + self.grace + 3.0:
                if self._starter(run).unreachable(run):
                    self.silent.append(run)
                run.kill()
                gone = " (its host, or the link to it, is gone)" if run in self.silent else ""
                run.status = RankStatus(None, error=f"did not answer when told to stop{gone}")
                for stream in run.streams:
                    self._close_stream(stream)
                if run in self.silent and not self.stopping:  # its host is gone: a spare may take it
                    self._replace(run, self._ranks_left())

    def _waiting_to_join(self) -> list[RankRun]:
        """Replacements that run but that the job has not admitted yet."""
        store = self.store
        return [r for r in self.joining if r.running and store is not None and store.admitted_in(r.spec.rank) is None]

    def _stop_unneeded_joiners(self) -> None:
        """A replacement that still waits to be admitted when every member has ended will never be:
        it is stopped, and its end is no failure."""
        waiting = self._waiting_to_join()
        members = [r for r in self.runs if r not in waiting]
        if not waiting or any(r.running for r in members) or self.pending:
            return
        for run in waiting:
            if run not in self.unneeded:
                self.unneeded.append(run)
                self._say(f"{self._where(run)} was not needed: the job ended before it could join; stopping it")
                run.send(b"T")

    def _check_reports(self, now: float) -> None:
        """Starts failing the job for a rank that reported the error it ends with FATAL_GRACE_S ago
        and has not exited yet (its exit status comes later, for the summary)."""
        if self.first_failure is not None or self.stopping or self.store is not None:
            return  # an elastic job decides when a rank that reported its error exits
        for run in self.runs:
            if run.running and run.error_at is not None and now - run.error_at >= FATAL_GRACE_S:
                self.first_failure = run
                run.failed_on_its_own = True
                self._check_states()
                return

    def _announce(self) -> None:
        """The line that says why the job is being stopped: the culprit as known now."""
        assert self.first_failure is not None
        run = blame.culprit(self.first_failure, self.runs)
        others = sum(1 for r in self.runs if r.running and r is not run)
        if run.status is not None:
            what = self._describe_failure(run)
        elif run.error is not None and not blame.is_consequence(run):
            what = f"raised {blame.headline(run.error)} and is exiting"
        else:
            what = f"failed with {blame.headline(run.error or {})} and is exiting"
        self._say(
            f"{self._where(run)} {what}; stopping the job"
            + (f" ({others} other rank(s) still running)" if others else "")
        )

    def _leads_heard(self, now: float) -> bool:
        """Whether every rank that the failures heard so far blame as leaving (a dead peer, a rank
        whose failure was shared) has reported its own error and printed its traceback, or exited:
        the culprit's own words then reach the summary, whichever rank's exit came first. A rank that
        reported but never says it printed (a tnt-comm of its own) gets FATAL_GRACE_S."""
        by_rank = {run.spec.rank: run for run in self.runs}
        for run in self.runs:
            for rank in blame.awaited(run):
                lead = by_rank.get(rank)
                if lead is None or not lead.running or lead.reported is not None:
                    continue
                if lead.error is None:
                    return False
                if not lead.printed and lead.error_at is not None and now - lead.error_at < FATAL_GRACE_S:
                    return False
        return True

    # -- stopped ranks ----------------------------------------------------------------------

    def _check_states(self) -> None:
        """Ask every agent whose rank still runs whether it is stopped, before the job is
        stopped: `_check_deadlines` stops it once all have answered or STATE_WAIT_S has passed."""
        if self.stopping:
            return
        asked = False
        for run in self.runs:
            if run.running and run.control is not None:
                run.state_asked = True
                run.send(b"S")
                asked = True
        if asked:
            self.check_until = time.monotonic() + STATE_WAIT_S
        else:
            self._stop_all()

    def _states_known(self) -> bool:
        return all(r.state is not None for r in self.runs if r.running and r.state_asked)

    # -- stopping ---------------------------------------------------------------------------

    @property
    def silent_hosts(self) -> list[str]:
        """Hosts whose agents stopped answering during the job, in rank order."""
        return list(dict.fromkeys(run.spec.host for run in self.silent))

    def _stop_all(self) -> None:
        self.check_until = None
        if self.stopping:
            return
        if self.first_failure is not None:
            self._announce()
        self.stopping = True
        for run in self.runs:
            if run.running and run.state_asked and run.state is None and self._starter(run).unreachable(run):
                # Its agent was asked and said nothing for STATE_WAIT_S: the host or the link to it
                # is gone, and a stop request would wait out the grace period for nothing.
                self.silent.append(run)
                run.kill()
                if run.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        run.proc.wait(timeout=2)
                run.status = RankStatus(None, error="did not answer")
                for stream in run.streams:
                    self._close_stream(stream)
            elif run.running:
                run.send(b"T")
        now = time.monotonic()
        self.kill_at = now + self.grace + 3.0
        self.abandon_at = self.kill_at + 5.0

    def _kill_all(self) -> None:
        for run in self.runs:
            if run.running:
                run.send(b"K")
        # Give the agents a moment to kill their ranks themselves, then kill what is left.
        self.kill_at = time.monotonic() + 1.0

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        self._check_generations(now)
        self._check_reports(now)
        if self.check_until is not None and (
            now >= self.check_until or (self._states_known() and self._leads_heard(now))
        ):
            self._stop_all()
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            for run in self.runs:
                if run.running:
                    run.kill()
        if self.abandon_at is not None and now >= self.abandon_at:
            for run in self.runs:
                if run.running:
                    self.abandoned.append(run)
                    for stream in run.streams:
                        self._close_stream(stream)
                    run.status = RankStatus(None, error="did not stop")

    # -- signals ----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._pending_signals.append(signum)

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        try:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            old_fd = signal.set_wakeup_fd(write_fd)
            for signum in _HANDLED_SIGNALS:
                previous[signum] = signal.signal(signum, self._on_signal)
        except ValueError:  # not the main thread: leave signals alone
            return previous
        self._wakeup = (read_fd, write_fd)
        previous[-1] = old_fd
        self.selector.register(read_fd, selectors.EVENT_READ, None)
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        if self._wakeup is None:
            return
        signal.set_wakeup_fd(previous.pop(-1))
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        self.selector.unregister(self._wakeup[0])
        for fd in self._wakeup:
            os.close(fd)
        self._wakeup = None

    def _handle_signals(self) -> None:
        if self._wakeup is not None:
            try:
                while os.read(self._wakeup[0], 512):
                    pass
            except BlockingIOError:
                pass
        while self._pending_signals:
            signum = self._pending_signals.pop(0)
            if signum == signal.SIGUSR1:
                # A warning before the end (sbatch --signal=B:USR1@T reaches the batch shell): passed on
                # to every rank, which checkpoints; the job goes on.
                for run in self.runs:
                    if run.running:
                        run.send(b"U")
                continue
            if self.received_signal is None:
                self.received_signal = signum
                running = sum(1 for r in self.runs if r.running)
                self._say(
                    f"got {signal_name(signum)}: stopping {running} rank(s) "
                    "(send it again to kill them at once)"
                )
                self._stop_all()
            else:
                self._say(f"got {signal_name(signum)} again: killing the ranks")
                self._kill_all()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to its end and return tnt-launch's exit code."""
        previous = self._install_signals()
        try:
            self.pending = list(self.plan.ranks)
            self._start_pending()
            while self.pending or any(run.running for run in self.runs):
                for key, _ in self.selector.select(timeout=0.1):
                    if key.data is None:
                        self._handle_signals()
                    else:
                        self._read(key.data)
                self._handle_signals()
                self._poll_exits()
                self._check_deadlines()
                self._start_pending()
        finally:
            self._let_go()
            self._restore_signals(previous)
            self.selector.close()
        return self._summary()

    def _let_go(self) -> None:
        """The job has ended (or tnt-launch is failing): every starter lets go of what it started,
        handing on the output that came after; every stream is flushed and closed."""
        for run in self.runs:
            run.close_stdin()
        for way, starter in self.starters.items():
            runs = [r for r in self.runs if r.spec.way == way]
            for name, got in starter.close(runs, self.grace):
                self._take(name, got)
        for run in self.runs:
            for stream in run.streams:
                self._close_stream(stream)

    # -- the end ----------------------------------------------------------------------------

    def _describe_failure(self, run: RankRun) -> str:
        return blame.describe_failure(run, self.stopping)

    def _summary(self) -> int:
        failure = self.first_failure
        if failure is not None:
            failure = blame.culprit(failure, self.runs)
            assert failure.status is not None
            code = failure.status.exit_code
            if failure.error is not None and failure.status.signal is not None and failure.stopped_by_us:
                code = 1  # it failed with an error; our SIGTERM only cut its teardown short
            groups = blame.no_progress(self.runs, self.plan.size)
            # A host that stopped answering explains everything after it: it leads.
            silent = [
                f"host {host} stopped answering ({_ranks([r.spec.rank for r in self.silent if r.spec.host == host])})"
                for host in self.silent_hosts
            ]
            if groups or silent:
                # Lead with the ranks that held the others up: their failures follow from it.
                held_up = "; ".join(
                    silent
                    + [
                        f"{_ranks(ranks)}{blame.on_hosts(self.plan, ranks)} made no progress ({reason})"
                        for ranks, reason in groups
                    ]
                )
                self._say(
                    f"job {self.plan.job_id} failed: {held_up}; rank {failure.spec.rank} "
                    f"{self._describe_failure(failure)}"
                )
                for run in self.runs:
                    if run.state and run.state.get("stopped"):
                        self._say(f"{self._where(run)} {blame.stopped_processes(run)}")
                self._say(f"{self._where(failure)} {self._describe_failure(failure)}")
            else:
                self._say(
                    f"job {self.plan.job_id} failed: {self._where(failure)} "
                    f"{self._describe_failure(failure)}"
                )
            # Other ranks' own failures are shown in full; those that followed from it, in one line.
            others = [r for r in self.runs if r.failed_on_its_own and r is not failure and not blame.is_consequence(r)]
            for run in [failure, *others]:
                if run is not failure:
                    self._say(f"{self._where(run)} also {self._describe_failure(run)}")
                if run.tail:
                    self._say(f"last lines rank {run.spec.rank} wrote to stderr:")
                    for line in run.tail:
                        self.output.write("err", f"    {line}\n".encode())
                else:
                    self._say(f"rank {run.spec.rank} wrote nothing to stderr")
            followed = [r for r in self.runs if r is not failure and blame.is_consequence(r)]
            if followed:
                kinds = ", ".join(dict.fromkeys(str((r.error or {}).get("kind")) for r in followed))
                self._say(f"{_ranks([r.spec.rank for r in followed])} failed as a consequence ({kinds})")
        elif self.received_signal is not None:
            code = 128 + self.received_signal
            self._say(
                f"job {self.plan.job_id} stopped after {signal_name(self.received_signal)}"
            )
        else:
            code = 0
            if self.lost or self.joining:
                finished = [r for r in self.runs if r.status is not None and r.status.ok]
                lost = "; ".join(f"{self._where(r)} {self._describe_failure(r)}" for r in self.lost) or "none"
                joined = [r for r in self.joining if r not in self.unneeded and r not in self.lost]
                self._say(
                    f"job {self.plan.job_id} finished on {len(finished)} rank(s); lost on the way: {lost}"
                    + (f"; joined: {_ranks([r.spec.rank for r in joined])}" if joined else "")
                )
        for host in self.silent_hosts:
            ranks = [r.spec.rank for r in self.silent if r.spec.host == host]
            self._say(
                f"host {host} stopped answering during the job ({_ranks(ranks)} ran there): a cut "
                "link, a dead host or a hung ssh session; its ranks were not stopped or tidied up "
                "there: they end at their own tnt-comm timeout, or with `tnt-launch --cleanup` once "
                "the host is back"
            )
            # An elastic job that went on without the host and finished succeeded.
            code = code or (0 if self.store is not None and failure is None and self.received_signal is None else 1)
        if self.abandoned:
            names = ", ".join(str(r.spec.rank) for r in self.abandoned)
            self._say(
                f"rank(s) {names} did not stop; `tnt-launch --cleanup` stops what is left of them"
            )
            code = code or 1
        if failure is not None:
            self._say(f"exit code {code}")
        return code
