"""What `--dry-run` prints: the plan as a table of ranks and the environment they get."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tnt_launch.plan import Plan

_SECRET = "TNT_JOB_TOKEN"
_MAX_LISTED = 8


def _per_rank(values: Sequence[str]) -> str:
    shown = [v if v else '""' for v in values]
    if len(shown) > _MAX_LISTED:
        shown = shown[: _MAX_LISTED - 2] + ["...", shown[-1]]
    return "per rank: " + ", ".join(shown)


def environment_rows(plan: Plan) -> list[tuple[str, str]]:
    """One (variable, value) row per exported variable; values that differ between ranks are
    listed per rank, and the job token is not shown."""
    names: list[str] = []
    for spec in plan.ranks:
        names.extend(name for name in spec.env if name not in names)
    rows = []
    for name in names:
        holders = [spec for spec in plan.ranks if name in spec.env]
        values = [spec.env[name] for spec in holders]
        if name == _SECRET:
            value = "(secret: 32 random hex digits, new for every launch)"
        elif len(set(values)) == 1:
            value = values[0] if values[0] else '"" (empty)'
        else:
            value = _per_rank(values)
        if len(holders) < plan.size:
            value += "  [ranks on other hosts; ranks on this host inherit it]"
        rows.append((name, value))
    return rows


def describe_timeout(value: str | None) -> str:
    """One line on how long a collective may make no progress before it fails."""
    if value is None:
        return "Collective timeout: the library's default (TNT_TIMEOUT_S is not set)."
    try:
        seconds = float(value)
    except ValueError:
        return f"Collective timeout: TNT_TIMEOUT_S={value}."
    if seconds == float("inf"):
        return "Collective timeout: none, collectives wait forever (TNT_TIMEOUT_S=inf)."
    return f"Collective timeout: {value} s without progress (TNT_TIMEOUT_S={value})."


def render_plan(plan: Plan, console: Console, assumed: Sequence[str] = ()) -> None:
    hosts = len(plan.hosts)
    console.print(
        Text(
            f"Plan of job {plan.job_id}: {plan.size} rank(s) on {hosts} host(s); "
            f"rank 0 listens on {plan.master_addr}:{plan.master_port}",
            style="bold",
        )
    )
    table = Table(show_lines=False, header_style="bold")
    for column in ("rank", "host", "local rank", "device", "pinning", "command"):
        table.add_column(column, overflow="fold")
    for spec in plan.ranks:
        host = spec.host if spec.local else f"{spec.host} (ssh)"
        # Text cells: brackets in commands or values are not rich markup.
        table.add_row(
            Text(str(spec.rank)),
            Text(host),
            Text(f"{spec.local_rank}/{spec.local_size}"),
            Text(spec.device),
            Text(spec.pinning),
            Text(shlex.join(spec.argv)),
        )
    console.print(table)

    env = Table(title="Environment exported to the ranks", header_style="bold",
                title_justify="left")
    env.add_column("variable", no_wrap=True)
    env.add_column("value", overflow="fold")
    for name, value in environment_rows(plan):
        env.add_row(Text(name), Text(value))
    console.print(env)
    console.print(Text(describe_timeout(plan.timeout)))
    if assumed:
        console.print(
            Text(
                "Not contacted for a dry run, assumed to have this host's GPUs, CPUs and NUMA "
                f"nodes: {', '.join(assumed)}."
            )
        )
    console.print(Text("Dry run: nothing was started."))
