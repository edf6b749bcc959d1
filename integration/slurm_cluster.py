"""A real Slurm cluster on this machine, for the tests: munged, slurmctld and slurmd.

Debian's packages (munge, slurmctld, slurmd, slurm-client), started by hand in a private folder with
their own key, ports, state and logs: nothing of the machine's own Slurm configuration (if any) is
read or touched. `SlurmdParameters=config_overrides` lets a node offer more CPUs than the machine
has, so that 2-core machines can run 4-task jobs.

- `up()`: one node, this host under its own name (the names Slurm hands to jobs resolve here).
- `up_on(cluster)`: one node per host of a cluster of network namespaces (netns_cluster.py), named
  tntnode0, tntnode1, ...: each node's daemons and jobs run in its host's namespaces and in a UTS
  namespace of its own under that name, with an /etc/hosts of the cluster's names bound over the
  machine's in the host's mount namespace. slurmctld runs on node 0, and so do `run`'s commands
  (salloc, srun), as on a cluster's first node.

As a script (as root), for trying things by hand:

    python integration/slurm_cluster.py up --state /tmp/slurm.json   # prints the SLURM_CONF to export
    python integration/slurm_cluster.py down --state /tmp/slurm.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("srun", "salloc", "sbatch", "sinfo", "squeue", "scancel", "scontrol")
INSTALL = "apt-get install munge slurmctld slurmd slurm-client"


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the cluster (not root, Slurm or munge missing); says why."""


def missing_requirements() -> str | None:
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    for program in DAEMONS + CLIENTS:
        if shutil.which(program) is None and not os.path.exists(f"/usr/sbin/{program}"):
            return f"{program} is not installed (Debian: {INSTALL})"
    return None


def _program(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port(rng: random.Random) -> int:
    # Below the kernel's ephemeral range (see packages/tnt-comm/tests/ranks.py: free_port).
    for _ in range(64):
        port = rng.randrange(2048, 10240)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise SlurmUnavailable("no free port for slurmctld")


@dataclass
class Slurm:
    """A running cluster: `env` is what clients (srun, salloc, sbatch) need to reach it."""

    folder: str
    node: str
    """The first node's name."""
    cpus: int
    pids: dict[str, int] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    anchors: list[int] = field(default_factory=list)
    """Per node on a namespace cluster: a process that holds its namespaces (network, mount, UTS)."""

    def on_node(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run on node `node`: in its namespaces where it has its own, else as it is."""
        if not self.anchors:
            return argv
        return ["nsenter", "-t", str(self.anchors[node]), "-n", "-m", "-u", "--", *argv]

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(Path(self.folder) / "slurm.conf")}

    def run(self, argv: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, salloc, ...) against this cluster; output captured as text."""
        env = {**self.env, **kwargs.pop("env", {})}  # type: ignore[dict-item]
        return subprocess.run(  # type: ignore[call-overload]
            self.on_node(0, argv), env=env, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )

    def log(self, daemon: str) -> str:
        """A daemon's log: "slurmctld", "munged", or "slurmd-NODE"."""
        path = Path(self.folder) / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def down(self) -> None:
        """Stop the daemons and namespace holders this cluster started (by PID), remove its folder."""
        daemons = sorted(name for name in self.pids if name.startswith("slurmd"))
        for name in [*daemons, "slurmctld", "munged"]:
            pid = self.pids.get(name)
            if pid is not None:
                _stop(pid)
        for pid in self.anchors:
            _stop(pid)
        shutil.rmtree(self.folder, ignore_errors=True)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        if not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _config(
    folder: Path, nodes: list[tuple[str, str]], cpus: int, ctld_port: int, slurmd_port: int,
    slurmd_timeout: int | None = None,
) -> str:
    """slurm.conf for `nodes` (name, address); slurmctld runs on the first; `slurmd_timeout`: how
    long a node may not answer before slurmctld sets it DOWN (Slurm's default: 300 s)."""
    lines = "".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN\n" for name, addr in nodes)
    if slurmd_timeout is not None:
        lines = f"SlurmdTimeout={slurmd_timeout}\n" + lines
    names = ",".join(name for name, _ in nodes)
    return f"""\
ClusterName=tnttest
SlurmctldHost={nodes[0][0]}({nodes[0][1]})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.sock
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
InactiveLimit=0
MinJobAge=10
{lines}PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def up(cpus: int = 4, timeout: float = 30.0) -> Slurm:
    """One node, this host: start munged, slurmctld and slurmd; return once the node takes jobs."""
    node = socket.gethostname().split(".")[0]
    try:
        # Jobs meet at their step's first node by its name (plain srun): it must resolve here.
        socket.getaddrinfo(node, None)
    except OSError as e:
        raise SlurmUnavailable(f"this host's name {node!r} does not resolve ({e}); add it to /etc/hosts") from None
    return _start([(node, "127.0.0.1")], [], cpus, timeout)


def up_on(netns: Any, cpus: int = 2, timeout: float = 30.0, slurmd_timeout: int | None = None) -> Slurm:
    """One node per host of `netns` (a running netns_cluster.Cluster), named tntnode0, tntnode1, ...;
    `slurmd_timeout` as `_config` takes it."""
    why = missing_requirements()
    if why is not None:
        raise SlurmUnavailable(why)
    nodes = [(f"tntnode{i}", netns.address(i)) for i in range(len(netns.hosts))]
    folder = Path(tempfile.mkdtemp(prefix="tnt-slurm-hosts-"))
    hosts = folder / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in nodes))
    anchors: list[int] = []
    try:
        for i, (name, _) in enumerate(nodes):
            # The host's mount namespace is its own (netns_cluster): the names resolve on it alone.
            _quiet(netns.command(i, ["mount", "--bind", str(hosts), "/etc/hosts"]))
            # `ip netns exec` gave it a /sys of its own, without the cgroup file systems slurmd reads.
            _quiet(netns.command(i, ["sh", "-c", _cgroup_mounts()]))
            anchor = subprocess.Popen(
                netns.command(i, ["unshare", "--uts", "sh", "-c", f"hostname {name} && exec sleep infinity"]),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            anchors.append(anchor.pid)
        for pid in anchors:
            _wait_hostname(pid, timeout)
        cluster = _start(nodes, anchors, cpus, timeout, slurmd_timeout)
    except BaseException:
        for pid in anchors:
            _stop(pid)
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # bound already: the mounts keep the file
    return cluster


def _cgroup_mounts() -> str:
    """Shell commands that mount the cgroup file systems as this machine has them under /sys/fs/cgroup
    (v1 controllers under a tmpfs, or one v2 tree): slurmd refuses a mix of the two."""
    commands = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, target, kind, options = line.split()[:4]
        if target == "/sys/fs/cgroup" and kind == "tmpfs":
            commands.append("mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup")
        elif target.startswith("/sys/fs/cgroup") and kind in ("cgroup", "cgroup2"):
            commands.append(f"mkdir -p {target} && mount -t {kind} -o {options} {kind} {target}")
    if not commands:
        raise SlurmUnavailable("this machine has no cgroup file system under /sys/fs/cgroup for slurmd")
    return " && ".join(commands)


def _wait_hostname(pid: int, timeout: float) -> None:
    """Wait until the namespace holder `pid` runs `sleep` (it has set its host name)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return
        time.sleep(0.02)
    raise SlurmUnavailable(f"a node's namespaces did not come up within {timeout:g} s")


def _start(
    nodes: list[tuple[str, str]], anchors: list[int], cpus: int, timeout: float, slurmd_timeout: int | None = None
) -> Slurm:
    why = missing_requirements()
    if why is not None:
        raise SlurmUnavailable(why)
    folder = Path(tempfile.mkdtemp(prefix="tnt-slurm-"))
    os.chmod(folder, 0o755)  # slurmd's tasks (the test's own user: root) read the config here
    cluster = Slurm(str(folder), nodes[0][0], cpus, nodes=[name for name, _ in nodes], anchors=list(anchors))
    try:
        (folder / "state").mkdir()
        for name, _ in nodes:
            (folder / f"spool-{name}").mkdir()
        ctld_port = _free_port(random.Random())
        slurmd_port = ctld_port + 1 if ctld_port < 10239 else ctld_port - 1
        (folder / "slurm.conf").write_text(_config(folder, nodes, cpus, ctld_port, slurmd_port, slurmd_timeout))
        _quiet([_program("mungekey"), "-c", "-k", str(folder / "munge.key")])
        _quiet([
            _program("munged"), "--force", f"--socket={folder}/munge.sock", f"--key-file={folder}/munge.key",
            f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
        ])
        cluster.pids["munged"] = _read_pid(folder / "munged.pid", timeout)
        env = cluster.env
        _quiet(cluster.on_node(0, [_program("slurmctld"), "-i"]), env=env)
        cluster.pids["slurmctld"] = _read_pid(folder / "slurmctld.pid", timeout)
        for i, (name, _) in enumerate(nodes):
            try:
                _quiet(cluster.on_node(i, [_program("slurmd")]), env=env)
            except SlurmUnavailable as e:
                log = cluster.log(f"slurmd-{name}")[-800:]
                raise SlurmUnavailable(f"{e}; slurmd's log on {name} ends: {log}") from None
            cluster.pids[f"slurmd-{name}"] = _read_pid(folder / f"slurmd-{name}.pid", timeout)
        _wait_idle(cluster, timeout)
    except BaseException:
        cluster.down()
        raise
    return cluster


def _quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise SlurmUnavailable(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()[-500:]}")


def _read_pid(path: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise SlurmUnavailable(f"{path.name} did not appear within {timeout:g} s")


def _wait_idle(cluster: Slurm, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        done = cluster.run(["sinfo", "-h", "-N", "-o", "%T"], timeout=10)
        state = " ".join(done.stdout.split())
        if state and all(word.startswith("idle") for word in state.split()):
            return
        time.sleep(0.2)
    raise SlurmUnavailable(
        f"the node is {state or 'unknown'} after {timeout:g} s, not idle; slurmd's log ends: "
        + cluster.log(f"slurmd-{cluster.nodes[-1]}")[-800:]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--state", required=True, help="JSON file that remembers the cluster")
    parser.add_argument("--cpus", type=int, default=4)
    args = parser.parse_args(argv)
    if args.action == "up":
        cluster = up(args.cpus)
        Path(args.state).write_text(json.dumps(asdict(cluster)))
        print(f"export SLURM_CONF={cluster.folder}/slurm.conf")
    else:
        Slurm(**json.loads(Path(args.state).read_text())).down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
