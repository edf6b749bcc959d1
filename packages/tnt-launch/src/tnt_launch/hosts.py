"""Which hosts a job runs on (hostfiles, Slurm allocations, or just this host), and how its ranks start."""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from tnt_launch import slurm
from tnt_launch.config import LaunchConfig, UsageError

_HOST_NAME = re.compile(r"^[A-Za-z0-9_.:%][A-Za-z0-9_.:%-]*$")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "::1")


@dataclass(frozen=True)
class Host:
    """One host of a job. `slots` is the rank count the hostfile asks for, if any; `local` says
    whether it is the host tnt-launch runs on (started directly, not over ssh); `spare` that it starts
    no rank, but takes the replacements of an elastic job whose ranks' host is gone."""

    name: str
    slots: int | None = None
    local: bool = False
    spare: bool = False


def is_loopback(name: str) -> bool:
    """Whether `name` can only mean the host it is used on."""
    return name.lower() in _LOOPBACK_NAMES or name.startswith("127.")


def is_local_host(name: str) -> bool:
    """Whether `name` is this host: a loopback name that tnt-launch uses as such, or this host's
    own name. Other loopback addresses (127.0.0.2, ...) count as other hosts, reached over ssh."""
    if name.lower() in ("localhost", "127.0.0.1", "::1"):
        return True
    hostname = socket.gethostname()
    return name in (hostname, hostname.split(".")[0])


def parse_hostfile_text(text: str, source: str) -> list[Host]:
    """Parse hostfile lines `host`, `host slots=K` or either with `spare` (a host kept for the
    replacements of `--elastic MIN:MAX`); blank lines and `#` comments are ignored.

    Raises UsageError naming `source` and the line for every mistake.
    """
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}:{number}"
        name = words[0]
        if not _HOST_NAME.match(name):
            raise UsageError(f"{where}: {name!r} is not a host name")
        slots = None
        spare = False
        for word in words[1:]:
            if word == "spare":
                spare = True
                continue
            key, eq, value = word.partition("=")
            if key != "slots" or not eq:
                raise UsageError(
                    f"{where}: unknown field {word!r} (a line is 'HOST', 'HOST slots=N', either with 'spare')"
                )
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"{where}: slots must be a positive whole number, not {value!r}")
            if slots is not None:
                raise UsageError(f"{where}: slots is given twice")
            slots = int(value)
        if name in seen:
            raise UsageError(
                f"{where}: host {name!r} is listed again (first on line {seen[name]}); "
                "host names must be unique"
            )
        seen[name] = number
        hosts.append(Host(name, slots, spare=spare))
    if not hosts:
        raise UsageError(f"{source}: the hostfile lists no hosts")
    if all(h.spare for h in hosts):
        raise UsageError(f"{source}: every host is a spare; the job needs at least one host to start on")
    return hosts


def parse_hostfile(path: str) -> list[Host]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read hostfile {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read hostfile {path}: it is not UTF-8 text") from None
    return parse_hostfile_text(text, path)


LAUNCHERS = ("local", "ssh", "srun")
"""How ranks start: on this host directly, over ssh (this host's ranks directly), or as the
tasks of one srun step inside a Slurm allocation."""


@dataclass(frozen=True)
class Placement:
    """Where a job runs and how its ranks start there."""

    hosts: list[Host]
    launcher: str
    allocation: slurm.Allocation | None = None


def _named(hosts: list[Host]) -> list[Host]:
    return [Host(h.name, h.slots, is_local_host(h.name), h.spare) for h in hosts]


def _allocation_hosts(config: LaunchConfig, found: slurm.Allocation, by_srun: bool) -> list[Host]:
    """The allocation's nodes, each with its task count as slots; with srun, `-n N` fills them. The
    nodes `-n N` leaves empty are spare hosts of an elastic job with replacements (--elastic
    MIN:MAX), each with its tasks as slots: a node lost takes its ranks' replacements there."""
    named = _named([Host(name) for name in found.nodes])
    counts = slurm.counts(found, config.nprocs if by_srun else None)
    hosts = [Host(h.name, count, h.local) for h, count in zip(named, counts, strict=True) if count != 0]
    if by_srun and config.elastic_max is not None:
        tasks = found.tasks_per_node or (1,) * len(named)
        hosts += [Host(h.name, slots, h.local, spare=True)
                  for h, count, slots in zip(named, counts, tasks, strict=True) if count == 0]
    return hosts


def resolve_hosts(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> Placement:
    """The hosts of the job and the launcher that starts its ranks.

    `--launcher` decides where given. Otherwise: the hostfile's hosts over ssh; inside a Slurm
    allocation its nodes through srun (over ssh where srun is missing, or `-n` asks for this host
    there); else this host alone."""
    environ = os.environ if environ is None else environ
    slurm.refuse_multitask_step(environ)
    found = slurm.allocation(environ)
    launcher = config.launcher
    if launcher == "srun" and found is None:
        raise UsageError(
            "--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST "
            "are not set); start tnt-launch in a salloc shell or an sbatch script"
        )
    if launcher in ("srun", "local") and config.hostfile is not None:
        raise UsageError(
            "--launcher srun starts ranks on the Slurm allocation's nodes; leave out --hostfile" if launcher == "srun"
            else "--launcher local starts ranks on this host only; leave out --hostfile"
        )
    if launcher == "local":
        return Placement([Host("localhost", local=True)], "local")
    if config.hostfile is not None:
        hosts = _named(parse_hostfile(config.hostfile))
        if any(h.spare for h in hosts) and config.elastic_max is None:
            raise UsageError(
                f"{config.hostfile}: a spare host takes the replacements of an elastic job; give "
                "--elastic MIN:MAX, or drop 'spare'"
            )
        return Placement(hosts, "ssh")
    if found is None or (config.nprocs is not None and launcher != "srun" and not _srun_here(launcher, environ)):
        return Placement([Host("localhost", local=True)], launcher or "local")
    by_srun = launcher == "srun" or _srun_here(launcher, environ)
    return Placement(_allocation_hosts(config, found, by_srun), "srun" if by_srun else "ssh", found)


def _srun_here(launcher: str | None, environ: Mapping[str, str]) -> bool:
    """Whether srun starts the ranks of an allocation where no launcher was asked for: where it is
    installed."""
    return launcher is None and shutil.which("srun", path=environ.get("PATH")) is not None
