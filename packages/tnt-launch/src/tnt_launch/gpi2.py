"""What tnt-launch sets up for `--transport gpi2`, in one place: the machinefile, every rank's GASPI_*
variables, and a range of GPI-2 ports of its own for every job on the launching host.

GPI-2 ranks start from GASPI_RANK, GASPI_SOCKET, GASPI_NRANKS and GASPI_MFILE; tnt-comm takes all
four or derives all four itself, never some, so they are set together, and only where rank 0 runs on
this host (GPI-2 reads the machinefile there, and only there). GPI-2 listens on fixed ports (base
10840) unless moved; tnt-comm moves them to TNT_GPI2_PORT_BASE and uses base+socket,
base+256+socket and base+512+socket, where socket is the rank's index among the ranks of its host.
So two jobs on one host need different bases.
"""

from __future__ import annotations

import errno
import random
import socket
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from tnt_launch import contract, jobs
from tnt_launch.config import LaunchError
from tnt_launch.hosts import Host, is_loopback

PORT_BASE_VARIABLE = contract.GPI2_PORT_BASE
NO_MACHINEFILE = "/dev/null"
"""GASPI_MFILE of every rank but 0: GPI-2 reads the machinefile on rank 0 only."""
NAME_MAX = 62
"""GPI-2 skips machinefile lines of 64 bytes or more, newline included."""


def machines(hosts: Sequence[Host], counts: Sequence[int], master_addr: str) -> list[str]:
    """Rank r's host on line r. Ranks of this host go by TNT_MASTER_ADDR (when rank 0 is here,
    that is the name other hosts reach it by), and so do loopback hosts (ssh to 127.0.0.2 is this
    machine too): GPI-2 numbers the ranks of one name as sockets 0, 1, ..., and those pick the
    ports, so each machine must appear under one name."""
    names: list[str] = []
    for host, count in zip(hosts, counts):
        name = master_addr if host.local or is_loopback(host.name) else host.name
        names.extend([name] * count)
    return names


def skipped(hosts: Sequence[Host], names: Sequence[str]) -> str | None:
    """Why tnt-launch leaves GASPI_* and the port base to tnt-comm, or None if it sets them."""
    if not hosts[0].local:
        # GPI-2 reads the machinefile on rank 0's host, where tnt-launch writes nothing; tnt-comm's
        # rank 0 writes one there itself, and picks ports that are free there.
        return f"rank 0 runs on {hosts[0].name}, not on this host"
    too_long = next((name for name in names if len(name) > NAME_MAX), None)
    if too_long is not None:
        return f"host name {too_long} is longer than the {NAME_MAX} characters of a GPI-2 machinefile line"
    return None


def sockets_needed(hosts: Sequence[Host], counts: Sequence[int], master_addr: str) -> int:
    """The most ranks of one machine: what a port base must leave room for; 0 where tnt-launch sets
    nothing up (see `skipped`)."""
    names = machines(hosts, counts, master_addr)
    return 0 if skipped(hosts, names) is not None else max(Counter(names).values())


@dataclass(frozen=True)
class Setup:
    """GPI-2 as planned for one job."""

    machines: tuple[str, ...] = ()
    """The machinefile's lines (rank r's host on line r); empty where tnt-comm derives GASPI_*."""
    machinefile: str | None = None
    sockets: tuple[int, ...] = ()
    port_base: int | None = None
    """The TNT_GPI2_PORT_BASE tnt-launch picked and sets (not the user's)."""
    note: str = ""
    """One line on what was set up, or why nothing was (for --dry-run)."""

    @property
    def rank_envs(self) -> list[dict[str, str]]:
        """GPI-2's variables of every rank, in rank order: all four (and the port base the launcher
        picked), or none."""
        size = len(self.machines)
        envs = []
        for rank, socket_index in enumerate(self.sockets):
            env = {
                "GASPI_RANK": str(rank),
                # The rank's index among the ranks of its machinefile name, as GPI-2 counts it: the
                # local rank, unless two host entries are one machine.
                "GASPI_SOCKET": str(socket_index),
                "GASPI_NRANKS": str(size),
                "GASPI_MFILE": (self.machinefile or NO_MACHINEFILE) if rank == 0 else NO_MACHINEFILE,
            }
            if self.port_base is not None:
                env[PORT_BASE_VARIABLE] = str(self.port_base)
            envs.append(env)
        return envs


def plan(
    hosts: Sequence[Host],
    counts: Sequence[int],
    master_addr: str,
    machinefile: str | None,
    port_base: int | None,
    users_port_base: bool,
) -> Setup:
    """The set-up for ranks `counts` per host: a machinefile at `machinefile` (the launcher writes it
    when the job starts) and `port_base` unless the user set TNT_GPI2_PORT_BASE."""
    names = machines(hosts, counts, master_addr)
    why = skipped(hosts, names)
    if why is not None:
        return Setup(
            note=f"GPI-2: {why}: tnt-comm derives GASPI_* from its rendezvous (and picks "
            f"{PORT_BASE_VARIABLE}, unless set) when the job starts."
        )
    if machinefile is None:
        raise ValueError("--transport gpi2 needs the path of the job's machinefile")
    seen: Counter[str] = Counter()
    sockets = []
    for name in names:
        sockets.append(seen[name])
        seen[name] += 1
    if users_port_base:
        ports = f"ports from {PORT_BASE_VARIABLE} as you set it"
        port_base = None
    elif port_base is not None:
        ports = f"ports from {PORT_BASE_VARIABLE}={port_base}, free here when planned"
    else:
        ports = "ports picked by tnt-comm"
    return Setup(
        machines=tuple(names),
        machinefile=machinefile,
        sockets=tuple(sockets),
        port_base=port_base,
        note=(
            f"GPI-2: machinefile {machinefile} ({len(names)} line(s), read by rank 0), written when the "
            f"job starts and removed when it ends; {ports}."
        ),
    )

PORT_BASE_LOW = 10240
PORT_BASE_HIGH = 32768 - 1024
"""The highest base whose 1024 ports stay below the ephemeral ports (32768 and up), which any
outgoing connection may take at any time."""
PORT_BASE_STEP = 1024
PORT_OFFSETS = (0, 256, 512)
MAX_SOCKETS = 256
"""Ranks per host a base leaves room for: socket 256 would take the next offset's first port."""


def port_free(port: int) -> bool:
    """Whether this host's TCP `port` can be bound now, with SO_REUSEADDR as GPI-2 binds: a port
    left in TIME_WAIT by an earlier job counts as free, as it does for GPI-2."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


CLAIM_BLOCK = 8
"""Ports per claim: a claim is one abstract Unix socket per block of 8 ports (see PortClaim)."""


def claim_name(port: int) -> str:
    """The abstract socket name that claims the block of ports holding `port`; tnt-comm's rank 0
    claims the same names for a base it picks (src/transport/gpi2_ports.hpp)."""
    return f"tnt-gpi2-ports:{port // CLAIM_BLOCK * CLAIM_BLOCK}"


class PortClaim:
    """A claim on every port of a GPI-2 port base, for the job that is to bind them.

    A port that is free now may have been chosen a moment ago by a job whose ranks have not bound
    it yet. Whoever picks a base (tnt-launch, or tnt-comm's rank 0 when the job has none) claims
    it: it binds one abstract Unix socket per block of ports, which the kernel keeps for the whole
    host (for its network namespace, the ports' own scope) until closed or its holder dies, and
    passes over any base of which a block is claimed.
    """

    def __init__(self, base: int, held: list[socket.socket]) -> None:
        self.base = base
        self._held = held

    @classmethod
    def take(cls, base: int, sockets: int) -> PortClaim | None:
        """Claims `base`'s ports for `sockets` ranks, all or none: None when another holds any."""
        held: list[socket.socket] = []
        for offset in PORT_OFFSETS:
            first = base + offset
            for block in range(first // CLAIM_BLOCK * CLAIM_BLOCK, first + sockets, CLAIM_BLOCK):
                s = _claim_block(claim_name(block))
                if s is None:
                    for h in held:
                        h.close()
                    return None
                if isinstance(s, socket.socket):
                    held.append(s)
        return cls(base, held)

    def close(self) -> None:
        for s in self._held:
            s.close()
        self._held = []


_UNCLAIMABLE = object()
"""What _claim_block gives where the host forbids abstract sockets (a security policy may): nothing
can be claimed there, and bases are picked by their ports being free, as before the claims."""


def _claim_block(name: str) -> socket.socket | object | None:
    """The socket holding `name`, None when another holds it, or _UNCLAIMABLE."""
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise LaunchError(
                f"--transport gpi2: no descriptor left to claim GPI-2's ports ({e.strerror})"
            ) from None
        return _UNCLAIMABLE
    try:
        s.bind("\0" + name)  # abstract: no file, gone with the socket
    except OSError as e:
        s.close()
        return None if e.errno == errno.EADDRINUSE else _UNCLAIMABLE
    return s


def free_port_base(
    sockets: int, taken: Collection[int] = (), rng: random.Random | None = None
) -> PortClaim:
    """A TNT_GPI2_PORT_BASE whose ports (base+offset+socket for every offset and every socket
    below `sockets`) are free on this host now, that no job in `taken` holds and no one claims,
    claimed for the caller, who keeps the claim until the job ends.

    Bases are multiples of 1024 in [10240, 31744], tried from a random one on, so that jobs
    starting at the same moment seldom try the same base first. Raises LaunchError when none is
    free or `sockets` exceeds what one base leaves room for.
    """
    if sockets > MAX_SOCKETS:
        raise LaunchError(
            f"--transport gpi2: {sockets} ranks on one host, but GPI-2's ports leave room for at "
            f"most {MAX_SOCKETS}"
        )
    bases = list(range(PORT_BASE_LOW, PORT_BASE_HIGH + 1, PORT_BASE_STEP))
    start = (rng or random.SystemRandom()).randrange(len(bases))
    for i in range(len(bases)):
        base = bases[(start + i) % len(bases)]
        if base in taken:
            continue
        claim = PortClaim.take(base, sockets)
        if claim is None:
            continue
        if all(port_free(base + offset + s) for offset in PORT_OFFSETS for s in range(sockets)):
            return claim
        claim.close()
    raise LaunchError(
        f"--transport gpi2: no free range of GPI-2 ports between {PORT_BASE_LOW} and "
        f"{PORT_BASE_HIGH + PORT_BASE_STEP - 1} on this host; set TNT_GPI2_PORT_BASE to a free one"
    )


@dataclass
class Reservation:
    """What the launcher holds for GPI-2 while a `--transport gpi2` job runs: where its machinefile
    goes and the port base it picked, claimed (none where the user set TNT_GPI2_PORT_BASE, or
    tnt-comm sets GPI-2 up: see `skipped`)."""

    machinefile: str | None = None
    claim: PortClaim | None = None
    written: bool = False

    @property
    def port_base(self) -> int | None:
        return None if self.claim is None else self.claim.base

    def write(self, machines: Sequence[str]) -> None:
        """Writes the machinefile (`machines`: the plan's lines) where the plan needs one."""
        if self.machinefile is None or not machines:
            return
        try:
            jobs.registry_dir(jobs.registry_override())  # made, private, where it is not yet
            jobs.write_machinefile(self.machinefile, machines)
        except OSError as e:
            raise LaunchError(f"cannot write the GPI-2 machinefile {self.machinefile}: {e.strerror}") from None
        self.written = True

    def release(self) -> None:
        """The job has ended: the machinefile goes, and the claim on the port base."""
        if self.written and self.machinefile is not None:
            jobs.remove_entry(self.machinefile)
        if self.claim is not None:
            self.claim.close()


def reserve(transport: str, job_id: str, sockets: int) -> Reservation:
    """For `--transport gpi2`: the machinefile's path, in the private registry folder named by the
    job (its finish and --cleanup remove it), and, where `sockets` > 0 (see `plan.gpi2_sockets`), a
    port base free here, held by no other running job of this user and claimed by no one, with the
    launcher's claim on it until the job ends."""
    if transport != "gpi2":
        return Reservation()
    registry = jobs.registry_path(jobs.registry_override())
    claim = free_port_base(sockets, jobs.gpi2_port_bases(registry)) if sockets else None
    return Reservation(jobs.machinefile_path(registry, job_id), claim)
