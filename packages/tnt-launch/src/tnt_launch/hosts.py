"""Which hosts a job runs on: hostfiles, Slurm allocations, or just this host."""

from __future__ import annotations

import itertools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from tnt_launch.config import LaunchConfig, LaunchError, UsageError

_HOST_NAME = re.compile(r"^[A-Za-z0-9_.:%][A-Za-z0-9_.:%-]*$")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "::1")


@dataclass(frozen=True)
class Host:
    """One host of a job. `slots` is the rank count the hostfile asks for, if any; `local` says
    whether it is the host tnt-launch runs on (started directly, not over ssh)."""

    name: str
    slots: int | None = None
    local: bool = False


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
    """Parse hostfile lines `host` or `host slots=K`; blank lines and `#` comments are ignored.

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
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if key != "slots" or not eq:
                raise UsageError(
                    f"{where}: unknown field {word!r} (a line is 'HOST' or 'HOST slots=N')"
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
        hosts.append(Host(name, slots))
    if not hosts:
        raise UsageError(f"{source}: the hostfile lists no hosts")
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


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_range_list(body: str, nodelist: str) -> list[str]:
    values = []
    for item in body.split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise LaunchError(f"cannot read Slurm node list {nodelist!r}: bad range {item!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise LaunchError(f"cannot read Slurm node list {nodelist!r}: bad range {item!r}")
        width = len(low)
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compact node list, e.g. 'gpu[01-03,07],cpu-a[1-2]b[1-2],login'."""
    names: list[str] = []
    for part in _split_top_level(nodelist.strip()):
        if not part:
            continue
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices = []
        for piece in pieces:
            if piece.startswith("["):
                choices.append(_expand_range_list(piece[1:-1], nodelist))
            elif "[" in piece or "]" in piece:
                raise LaunchError(f"cannot read Slurm node list {nodelist!r}: unbalanced brackets")
            else:
                choices.append([piece])
        names.extend("".join(combo) for combo in itertools.product(*choices))
    return names


def slurm_hosts(environ: Mapping[str, str]) -> list[Host] | None:
    """The nodes of the Slurm allocation we run in, or None outside one.

    SLURM_NTASKS_PER_NODE, when the allocation sets it, becomes every node's slots.
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    slots = int(per_node) if per_node.isdigit() and int(per_node) > 0 else None
    return [Host(name, slots) for name in expand_slurm_nodelist(nodelist)]


def resolve_hosts(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> list[Host]:
    """The hosts of the job: the hostfile's, else the Slurm allocation's (unless `-n` asks for
    this host), else this host alone."""
    environ = os.environ if environ is None else environ
    if config.hostfile is not None:
        hosts = parse_hostfile(config.hostfile)
    elif config.nprocs is None and (found := slurm_hosts(environ)) is not None:
        hosts = found
    else:
        return [Host("localhost", local=True)]
    return [Host(h.name, h.slots, is_local_host(h.name)) for h in hosts]
