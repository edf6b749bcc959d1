"""The agent (`_agent.py`) on the hosts of a job: how it starts (here, over ssh, or as a task of an
srun step: the starters in `starters/`), what it is told, and the questions a host answers through it.

Every agent is the same few lines of Python (`BOOTSTRAP`) given to an interpreter with `-I -c`;
they read one JSON line from stdin that carries the source of `contract.py`, `jobs.py` and
`_agent.py` and the request. So other hosts need a Python 3.8+ but not tnt-launch, and nothing
about a rank (its environment with the job token, its arguments) appears on a command line or
passes through a shell: the only shell-quoted words are the interpreter's path and the bootstrap itself.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tnt_launch import _agent, contract, jobs
from tnt_launch.config import LaunchError
from tnt_launch.hosts import Host

CONNECT_TIMEOUT_S = 10

BOOTSTRAP = """\
import json, os, sys, types
data = b""
while b"\\n" not in data:
    chunk = os.read(0, 65536)
    if not chunk:
        sys.exit(70)
    data += chunk
line, _, rest = data.partition(b"\\n")
message = json.loads(line)
package = types.ModuleType("tnt_launch")
package.__path__ = []
sys.modules["tnt_launch"] = package
for name, source in message["modules"]:
    module = types.ModuleType("tnt_launch." + name)
    sys.modules[module.__name__] = module
    setattr(package, name, module)
    exec(compile(source, "tnt_launch/" + name + ".py", "exec"), module.__dict__)
sys.exit(sys.modules["tnt_launch._agent"].main(message["request"], rest))
"""

_AGENT_MODULES = ("contract", "jobs", "_agent")  # in import order


@dataclass(frozen=True)
class SshSettings:
    """How to reach other hosts: `--ssh-port` and the words of TNT_SSH_OPTS."""

    port: int | None = None
    options: tuple[str, ...] = ()


def _module_sources() -> list[list[str]]:
    # Each module's own file: the contract's is tnt-comm's (contract.py loads it from there).
    modules = {"contract": contract, "jobs": jobs, "_agent": _agent}
    return [[name, Path(str(modules[name].__file__)).read_text(encoding="utf-8")] for name in _AGENT_MODULES]


def request_line(request: dict[str, Any]) -> bytes:
    """The line that tells a freshly started agent what to do."""
    return (json.dumps({"modules": _module_sources(), "request": request}) + "\n").encode()


def local_agent_argv() -> list[str]:
    return [sys.executable, "-I", "-c", BOOTSTRAP]


def remote_command(python: str) -> str:
    """The command string ssh hands to the remote login shell: the agent under `python` if that
    exists there (same installation on all hosts), else under the first python3 on its PATH."""
    return (
        f'P={shlex.quote(python)}; [ -x "$P" ] || P=python3; '
        f'exec "$P" -I -c {shlex.quote(BOOTSTRAP)}'
    )


def ssh_argv(host: str, ssh: SshSettings, command: str) -> list[str]:
    """ssh's argv for running `command` on `host`.

    The user's options come first because ssh keeps the first value it is given for an option, so
    TNT_SSH_OPTS can override the defaults: no password prompts (BatchMode), a connect timeout,
    keep-alive messages that end the connection (and so fail the rank) within about a minute of
    the other host going silent, no terminal and no X11 forwarding.
    """
    argv = ["ssh", *ssh.options]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    argv += [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
        "-T", "-x",
    ]
    return [*argv, "--", host, command]


def agent_argv(host: Host, ssh: SshSettings) -> list[str]:
    if host.local:
        return local_agent_argv()
    return ssh_argv(host.name, ssh, remote_command(sys.executable))


def hand_request(proc: subprocess.Popen[bytes], request: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Write `request` on a just-started agent's stdin (left open: closing it stops the rank)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(request_line(request))
        proc.stdin.flush()
    except BrokenPipeError:
        pass
    return proc


def start_agent(host: Host, ssh: SshSettings, request: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start the agent for one rank. Its stdin stays open: closing it stops the rank."""
    proc = subprocess.Popen(
        agent_argv(host, ssh),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own session: Ctrl+C in the terminal reaches tnt-launch alone, which then stops the
        # ranks in order.
        start_new_session=True,
    )
    return hand_request(proc, request)


def query_host(host: Host, ssh: SshSettings, request: dict[str, Any], timeout: float) -> Any:
    """Serve a probe, cleanup or finish request on `host`: in this process when it is local,
    else through an agent over ssh. Raises LaunchError when the host cannot answer."""
    if host.local:
        result = _agent.serve(request)
    else:
        try:
            done = subprocess.run(
                agent_argv(host, ssh),
                input=request_line(request),
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise LaunchError(f"host {host.name} did not answer within {timeout:g} s") from None
        except OSError as e:
            raise LaunchError(f"cannot run ssh to reach host {host.name}: {e.strerror}") from None
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, ValueError):
            errors = done.stderr.decode(errors="replace").strip().splitlines()
            reason = errors[-1] if errors else f"exit status {done.returncode}"
            raise LaunchError(f"cannot reach host {host.name} over ssh: {reason}") from None
    if isinstance(result, dict) and "error" in result:
        raise LaunchError(f"host {host.name}: {result['error']}")
    return result


def query_hosts(
    hosts: Sequence[Host],
    ssh: SshSettings,
    make_request: Callable[[Host], dict[str, Any]],
    timeout: float,
) -> list[tuple[Host, Any, LaunchError | None]]:
    """`query_host` on all hosts at once; returns (host, result, error) in host order."""

    def one(host: Host) -> tuple[Host, Any, LaunchError | None]:
        try:
            return host, query_host(host, ssh, make_request(host), timeout), None
        except LaunchError as e:
            return host, None, e

    if len(hosts) == 1:
        return [one(hosts[0])]
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(one, hosts))
