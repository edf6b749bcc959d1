"""GPI-2's ports for `--transport gpi2`: a range of its own for every job on the launching host.

GPI-2 listens on fixed ports (base 10840) unless moved; tnt-comm moves them to TNT_GPI2_PORT_BASE
and uses base+socket, base+256+socket and base+512+socket, where socket is the rank's index among
the ranks of its host. So two jobs on one host need different bases.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection

from tnt_launch.config import LaunchError

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


def free_port_base(
    sockets: int, taken: Collection[int] = (), rng: random.Random | None = None
) -> int:
    """A TNT_GPI2_PORT_BASE whose ports (base+offset+socket for every offset and every socket
    below `sockets`) are free on this host now and that no job in `taken` holds.

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
        if all(port_free(base + offset + s) for offset in PORT_OFFSETS for s in range(sockets)):
            return base
    raise LaunchError(
        f"--transport gpi2: no free range of GPI-2 ports between {PORT_BASE_LOW} and "
        f"{PORT_BASE_HIGH + PORT_BASE_STEP - 1} on this host; set TNT_GPI2_PORT_BASE to a free one"
    )
