"""``python -m tnt_comm.store``: the rendezvous store as a process of its own, for an elastic job
(``TNT_ELASTIC``) started by a launcher other than tnt-launch (which holds its own). The ranks find
it at ``TNT_MASTER_ADDR``/``TNT_MASTER_PORT`` and present ``TNT_JOB_TOKEN``; it outlives every rank.

It prints the port it listens on, then serves until its standard input closes or it is signalled.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from . import _core, contract


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tnt_comm.store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: every interface)")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed)")
    args = parser.parse_args(argv)
    token = os.environ.get(contract.JOB_TOKEN)
    if not token:
        parser.error(f"set {contract.JOB_TOKEN} to the token the ranks will present")
    service = _core.StoreService(args.host, args.port, token)
    print(service.port, flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
