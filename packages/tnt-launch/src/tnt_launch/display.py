"""What `--dry-run` prints: the plan as a table of ranks and the environment they get.

On a terminal the plan is drawn as tables (`render_plan`); into a file or a pipe it is written as
plain lines (`write_plan`), one per rank and one per variable, never wrapped, so that `grep` finds
every command and value whole.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tnt_launch import slurm
from tnt_launch.plan import Plan, RankSpec

_SECRET = "TNT_JOB_TOKEN"
_SECRET_TEXT = "(secret: 32 random hex digits, new for every launch)"
_REMOTE_ONLY = "[ranks on other hosts; ranks on this host inherit it]"
_MAX_LISTED = 8
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """`text` as it is, or, when it holds a line break or another control character, in the
    shell's $'...' quoting (`$'line 1\\nline 2'`), so that it stays on one line."""
    if not _CONTROL.search(text):
        return text
    body = "".join(
        _ESCAPES.get(c) or (f"\\x{ord(c):02x}" if _CONTROL.match(c) else c) for c in text
    )
    return f"$'{body}'"


def command_line(argv: Sequence[str]) -> str:
    """The command as a shell would read it, on one line."""
    return " ".join(one_line(w) if _CONTROL.search(w) else shlex.quote(w) for w in argv)


def _per_rank(values: Sequence[str], limit: int | None = _MAX_LISTED) -> str:
    shown = [one_line(v) if v else '""' for v in values]
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 2] + ["...", shown[-1]]
    return "per rank: " + ", ".join(shown)


def _variables(plan: Plan) -> list[tuple[str, list[str], bool]]:
    """(name, the values of the ranks that get it, whether only ranks on other hosts get it) of
    every exported variable, in the order they are set."""
    names: list[str] = []
    for spec in plan.ranks:
        names.extend(name for name in spec.env if name not in names)
    result = []
    for name in names:
        values = [spec.env[name] for spec in plan.ranks if name in spec.env]
        result.append((name, values, len(values) < plan.size))
    return result


def environment_rows(plan: Plan) -> list[tuple[str, str]]:
    """One (variable, value) row per exported variable; values that differ between ranks are
    listed per rank, and the job token is not shown."""
    rows = []
    for name, values, remote_only in _variables(plan):
        if name == _SECRET:
            value = _SECRET_TEXT
        elif len(set(values)) == 1:
            value = values[0] if values[0] else '"" (empty)'
        else:
            value = _per_rank(values)
        if remote_only:
            value += "  " + _REMOTE_ONLY
        rows.append((name, value))
    return rows


def environment_lines(plan: Plan) -> list[str]:
    """One `NAME=VALUE` line per exported variable: the value exactly (in $'...' quoting when it
    holds a line break), every rank's value when they differ, and no job token."""
    lines = []
    for name, values, remote_only in _variables(plan):
        if name == _SECRET:
            value = _SECRET_TEXT
        elif len(set(values)) == 1:
            value = one_line(values[0])
        else:
            value = _per_rank(values, limit=None)
        lines.append(f"{name}={value}" + (f"  {_REMOTE_ONLY}" if remote_only else ""))
    return lines


def host_label(plan: Plan, spec: RankSpec) -> str:
    """The rank's host, and how it is reached where that is not directly."""
    if plan.launcher == "srun":
        return f"{spec.host} (srun)"
    return spec.host if spec.local else f"{spec.host} (ssh)"


def describe_launch(plan: Plan) -> str | None:
    """Under srun, the one srun line that starts every rank; None for the other launchers."""
    if plan.launcher != "srun":
        return None
    argv = slurm.srun_argv(plan.size, plan.cpus_per_task, ["AGENT"])
    return (
        f"Started by one srun step, task r running rank r's agent: {command_line(argv)} (AGENT: tnt-launch's "
        "agent under this Python; SLURM_HOSTFILE lists rank r's host on line r)"
    )


def rank_line(spec: RankSpec, plan: Plan) -> str:
    """One rank of the plan on one line, its full command last."""
    host = host_label(plan, spec)
    return (
        f"rank {spec.rank} host {host} local_rank {spec.local_rank}/{spec.local_size} "
        f"device {spec.device} pinning {spec.pinning} cmd: {command_line(spec.argv)}"
    )


def _describe_seconds(value: str | None, title: str, variable: str, default: str, forever: str, limit: str) -> str:
    """One line on a limit in seconds as the ranks see it in `variable`: unset, `inf` or a number."""
    if value is None:
        return f"{title}: the library's default{default} ({variable} is not set)."
    try:
        seconds = float(value)
    except ValueError:
        return f"{title}: {variable}={value}."
    if seconds == float("inf"):
        return f"{title}: none, {forever} ({variable}=inf)."
    return f"{title}: {value} s {limit} ({variable}={value})."


def describe_timeout(value: str | None) -> str:
    """One line on how long a collective may make no progress before it fails."""
    return _describe_seconds(value, "Collective timeout", "TNT_TIMEOUT_S", "", "collectives wait forever",
                             "without progress")


def describe_start_timeout(value: str | None) -> str:
    """One line on how long the ranks may take to start and meet."""
    return _describe_seconds(value, "Start timeout", "TNT_START_TIMEOUT_S",
                             ", the collective timeout but at least 60 s", "ranks wait forever for each other",
                             "for every rank to start and meet")


def _title(plan: Plan) -> str:
    spares = [h for h in plan.hosts if h.spare]
    return (
        f"Plan of job {plan.job_id}: {plan.size} rank(s) on {len(plan.hosts) - len(spares)} host(s); "
        f"rank 0 listens on {plan.master_addr}:{plan.master_port}"
    )


def spare_line(plan: Plan) -> str | None:
    """One line on the spare hosts (hostfile lines marked `spare`), if any."""
    slots: dict[str, int] = {}
    for spec in plan.spares:
        slots[spec.host] = slots.get(spec.host, 0) + 1
    if not slots:
        return None
    hosts = ", ".join(f"{host} ({count} slot(s))" for host, count in slots.items())
    return f"Spare hosts, for replacements of ranks whose host is gone (--elastic MIN:MAX): {hosts}"


def _assumed(assumed: Sequence[str]) -> str:
    return (
        "Not contacted for a dry run, assumed to have this host's GPUs, CPUs and NUMA "
        f"nodes: {', '.join(assumed)}."
    )


_DONE = "Dry run: nothing was started."


def write_plan(plan: Plan, out: TextIO, assumed: Sequence[str] = ()) -> None:
    """The plan as plain lines, for a file or a pipe: nothing wrapped, nothing drawn."""
    lines = [_title(plan), *(rank_line(spec, plan) for spec in plan.ranks)]
    if (spare := spare_line(plan)) is not None:
        lines.append(spare)
    if (launch := describe_launch(plan)) is not None:
        lines.append(launch)
    lines += ["Environment exported to the ranks:", *environment_lines(plan)]
    lines += [describe_timeout(plan.timeout), describe_start_timeout(plan.start_timeout)]
    if plan.gpi2 is not None:
        lines.append(one_line(plan.gpi2))
    if assumed:
        lines.append(_assumed(assumed))
    lines.append(_DONE)
    out.write("".join(line + "\n" for line in lines))
    out.flush()


def render_plan(plan: Plan, console: Console, assumed: Sequence[str] = ()) -> None:
    """The plan as tables, for a terminal."""
    console.print(Text(_title(plan), style="bold"))
    table = Table(show_lines=False, header_style="bold")
    for column in ("rank", "host", "local rank", "device", "pinning", "command"):
        table.add_column(column, overflow="fold")
    for spec in plan.ranks:
        host = host_label(plan, spec)
        # Text cells: brackets in commands or values are not rich markup.
        table.add_row(
            Text(str(spec.rank)),
            Text(host),
            Text(f"{spec.local_rank}/{spec.local_size}"),
            Text(spec.device),
            Text(spec.pinning),
            Text(command_line(spec.argv)),
        )
    console.print(table)
    if (spare := spare_line(plan)) is not None:
        console.print(Text(spare))
    if (launch := describe_launch(plan)) is not None:
        console.print(Text(launch))

    env = Table(title="Environment exported to the ranks", header_style="bold",
                title_justify="left")
    env.add_column("variable", no_wrap=True)
    env.add_column("value", overflow="fold")
    for name, value in environment_rows(plan):
        env.add_row(Text(name), Text(value))
    console.print(env)
    console.print(Text(describe_timeout(plan.timeout)))
    console.print(Text(describe_start_timeout(plan.start_timeout)))
    if plan.gpi2 is not None:
        console.print(Text(one_line(plan.gpi2)))
    if assumed:
        console.print(Text(_assumed(assumed)))
    console.print(Text(_DONE))
