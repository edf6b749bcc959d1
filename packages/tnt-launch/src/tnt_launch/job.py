"""Running one job, from its configuration to its end: where it runs, a look at its hosts, its plan,
its ranks started and supervised, and what is left of it tidied up on every host."""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console

from tnt_launch import _agent, command, gpi2, jobs, starters
from tnt_launch.agents import SshSettings
from tnt_launch.config import LaunchConfig, LaunchError, UsageError
from tnt_launch.display import render_plan, write_plan
from tnt_launch.hosts import Host, Placement, resolve_hosts
from tnt_launch.plan import HostFacts, JobIdentity, Plan, build_plan, gpi2_sockets
from tnt_launch.store import ElasticStore
from tnt_launch.supervise import Supervisor

PROBE_TIMEOUT_S = 60.0
FINISH_TIMEOUT_S = 20.0


def run(config: LaunchConfig) -> int:
    """Carries out `config`: runs the job it describes, prints its plan (--dry-run), or stops
    earlier jobs on its hosts (--cleanup); tnt-launch's exit code."""
    placement = resolve_hosts(config)
    allocated = placement.allocation.cpus_per_task if placement.allocation is not None else None
    ways = starters.for_launcher(
        placement.launcher, SshSettings(config.ssh_port, config.ssh_options), allocated,
        elastic=config.elastic_min is not None,
    )
    if config.cleanup:
        return stop_earlier_jobs(config, placement, ways)
    if not config.dry_run:
        command.check_script(config, placement.hosts)
    facts, port, assumed = probe(config, placement, ways)
    job_id, token = secrets.token_hex(6), secrets.token_hex(16)
    store, store_addr = _elastic_store(config, placement.hosts, job_id, token)
    reservation = gpi2.reserve(config.transport, job_id, gpi2_sockets(config, placement.hosts, facts, os.environ))
    try:
        identity = JobIdentity(
            job_id, token, port if store is None else store.port, reservation.port_base, reservation.machinefile,
            master_addr=store_addr,
        )
        plan = build_plan(
            config, placement.hosts, facts, identity, os.environ, stdout_tty=_stdout_is_tty(),
            launcher=placement.launcher, cpus_per_task=allocated,
        )
        _tell(config, plan)
        if config.dry_run:
            _show(plan, assumed)
            return 0
        _prepare_outputs(config, plan)
        reservation.write(plan.gpi2_machines)
        return _run(config, plan, ways, store)
    finally:
        reservation.release()
        if store is not None:
            store.close()


def _elastic_store(config: LaunchConfig, hosts: Sequence[Host], job_id: str, token: str) -> tuple[ElasticStore | None, str | None]:
    """The store of an elastic job, which tnt-launch holds so that it outlives every rank, and the
    address the ranks reach it at; (None, None) for other jobs (rank 0 holds theirs) and dry runs."""
    if config.elastic_min is None or config.dry_run:
        return None, None
    if all(h.local for h in hosts):
        return ElasticStore("127.0.0.1", 0, token, job_id), "127.0.0.1"
    # The address of this host on its route to the others: what they reach it at.
    other = next(h for h in hosts if not h.local)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as route:
            route.connect((other.name, 9))  # no packet is sent: this only picks the route
            address = route.getsockname()[0]
    except OSError as e:
        raise LaunchError(
            f"--elastic: tnt-launch holds the job's rendezvous store, and finds no route from this host "
            f"to {other.name} to offer it on ({e.strerror or e})"
        ) from None
    return ElasticStore("0.0.0.0", 0, token, job_id), address


def probe(config: LaunchConfig, placement: Placement, ways: starters.Ways) -> tuple[dict[str, HostFacts], int, list[str]]:
    """Facts about every host and a free port on the first; with --dry-run other hosts are not
    contacted and are assumed to look like this one (their names come third)."""
    hosts = placement.hosts
    if config.dry_run:
        here = _agent.probe({"want_port": True})
        facts = HostFacts.from_probe(here)
        assumed = [h.name for h in hosts if not h.local or placement.launcher == "srun"]
        return {h.name: facts for h in hosts}, int(here["port"]), assumed
    first = hosts[0].name
    answers = ways.query(hosts, lambda h: {"mode": "probe", "want_port": h.name == first}, PROBE_TIMEOUT_S)
    errors = [str(error) for _, _, error in answers if error is not None]
    if errors:
        raise LaunchError("; ".join(errors))
    return {host.name: HostFacts.from_probe(result) for host, result, _ in answers}, int(answers[0][1]["port"]), []


def _tell(config: LaunchConfig, plan: Plan) -> None:
    for warning in plan.warnings:
        print(f"tnt-launch: warning: {warning}", file=sys.stderr)
    if config.log_level in ("DEBUG", "INFO"):
        for note in plan.notes:
            print(f"tnt-launch: info: {note}", file=sys.stderr)


def _show(plan: Plan, assumed: Sequence[str]) -> None:
    if sys.stdout.isatty():
        render_plan(plan, Console(), assumed)
    else:
        # Into a file or a pipe: plain lines that no terminal width can wrap.
        write_plan(plan, sys.stdout, assumed)


def _stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # no stdout, or a closed one
        return False


def _prepare_outputs(config: LaunchConfig, plan: Plan) -> None:
    """Makes --output-dir, and refuses a --timeline FILE that rank 0 could not write, before anything
    starts: a whole job's training must not end in a trace it cannot save. The timeline is checked
    where rank 0 runs on this host (elsewhere, rank 0 warns if its write fails)."""
    if config.output_dir is not None:
        try:
            os.makedirs(config.output_dir, exist_ok=True)
        except OSError as e:
            raise LaunchError(f"cannot create --output-dir {config.output_dir}: {e.strerror}") from None
    path = config.timeline
    if path is None or not plan.ranks or not plan.ranks[0].local:
        return
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise UsageError(f"--timeline {path}: is a folder; name the file to write, e.g. {os.path.join(path, 'trace.json')}")
    if not os.path.isdir(folder):
        raise UsageError(f"--timeline {path}: the folder {folder} does not exist; create it first (mkdir -p {folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--timeline {path}: the folder {folder} cannot be written by this user; choose another place")


def _run(config: LaunchConfig, plan: Plan, ways: starters.Ways, store: ElasticStore | None = None) -> int:
    """Starts and supervises the ranks, registered on this host while they run; tidies up after."""
    registry = jobs.registry_dir(jobs.registry_override())
    entry = jobs.write_entry(
        registry,
        f"{plan.job_id}.launcher.json",
        {
            "job_id": plan.job_id,
            "role": "launcher",
            "script": plan.script,
            "script_path": plan.script_path,
            "processes": [jobs.process_entry(os.getpid())],
            # Keeps the range from other jobs of this user starting before this one binds it.
            "gpi2_port_base": plan.gpi2_port_base,
        },
    )
    supervisor = Supervisor(plan, config, ways, store=store)
    try:
        return supervisor.run()
    finally:
        try:
            finish(plan, ways, supervisor.silent_hosts)
        finally:
            jobs.remove_entry(entry)


def finish(plan: Plan, ways: starters.Ways, silent: Sequence[str] = ()) -> None:
    """Removes what the job may have left on its hosts (processes, registry entries, /dev/shm).

    This host is always visited: it holds the launcher's registry entry. Hosts that stopped
    answering during the job (`silent`, named in the summary) are not: each would cost a connect
    timeout. Under srun every node of the job is visited by one more srun step."""
    by_srun = plan.launcher == "srun"
    ranks_here = any(h.local for h in plan.hosts) and not by_srun

    def request(host: Host) -> dict[str, Any]:
        shm = ranks_here or not host.local or by_srun
        return {"mode": "finish", "job_id": plan.job_id, "registry": jobs.registry_override(), "shm": shm}

    answers = ways.query_here(request, FINISH_TIMEOUT_S)
    others: list[Host] = list(plan.hosts) if by_srun else [
        h for h in plan.hosts if not h.local and h.name not in silent
    ]
    if others:
        answers += ways.query(others, request, FINISH_TIMEOUT_S)
    for host, _, error in answers:
        if error is not None:
            print(f"tnt-launch: warning: could not tidy up after the job on {host.name}: {error}", file=sys.stderr)


def stop_earlier_jobs(config: LaunchConfig, placement: Placement, ways: starters.Ways) -> int:
    """--cleanup: stops the processes of earlier jobs of this user (of SCRIPT, where given) on the
    job's hosts; 1 where a host could not be reached."""
    script = config.registered_script
    request: Mapping[str, Any] = {
        "mode": "cleanup",
        "script": script,
        "script_path": None if script is None else os.path.realpath(os.path.join(config.cwd, script)),
        "force": config.force,
        "registry": jobs.registry_override(),
        "grace": jobs.GRACE_S,
    }
    failed = False
    answers = ways.query(placement.hosts, lambda _: dict(request), jobs.GRACE_S + 60)
    for host, stopped, error in answers:
        if error is not None:
            print(f"tnt-launch: error: {error}", file=sys.stderr)
            failed = True
        elif not stopped:
            print(f"{host.name}: no running tnt-launch jobs" + (f" of {script}" if script else ""))
        for job in stopped or ():
            print(f"{host.name}: stopped job {job['job_id']} ({job['script']}, {job['processes']} process(es))")
    return 1 if failed else 0
