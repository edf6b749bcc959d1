"""A real one-node Slurm cluster on this machine, for the tests: munged, slurmctld and slurmd.

Debian's packages (munge, slurmctld, slurmd, slurm-client), started by hand in a private folder with
their own key, ports, state and logs: nothing of the machine's own Slurm configuration (if any) is
read or touched. The node is this host under its own name, so the names Slurm hands to jobs
(SLURM_STEP_NODELIST) resolve here; `SlurmdParameters=config_overrides` lets it offer more CPUs
than the machine has, so that 2-core machines can run 4-task jobs.

As a script (as root), for trying things by hand:

    python integration/slurm_cluster.py up --state /tmp/slurm.json   # prints the SLURM_CONF to export
    python integration/slurm_cluster.py down --state /tmp/slurm.json
"""

from __future__ import annotations

import argparse
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
    cpus: int
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(Path(self.folder) / "slurm.conf")}

    def run(self, argv: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a client command (srun, salloc, ...) against this cluster; output captured as text."""
        env = {**self.env, **kwargs.pop("env", {})}  # type: ignore[dict-item]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]

    def log(self, daemon: str) -> str:
        path = Path(self.folder) / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def down(self) -> None:
        """Stop the daemons this cluster started (by PID) and remove its folder."""
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.get(name)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _config(folder: Path, node: str, cpus: int, ctld_port: int, slurmd_port: int) -> str:
    return f"""\
ClusterName=tnttest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.sock
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
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
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def up(cpus: int = 4, timeout: float = 30.0) -> Slurm:
    """Start munged, slurmctld and slurmd; return once the node takes jobs."""
    why = missing_requirements()
    if why is not None:
        raise SlurmUnavailable(why)
    folder = Path(tempfile.mkdtemp(prefix="tnt-slurm-"))
    os.chmod(folder, 0o755)  # slurmd's tasks (the test's own user: root) read the config here
    node = socket.gethostname().split(".")[0]
    cluster = Slurm(str(folder), node, cpus)
    try:
        (folder / "state").mkdir()
        (folder / "spool").mkdir()
        rng = random.Random()
        ctld_port = _free_port(rng)
        slurmd_port = ctld_port + 1 if ctld_port < 10239 else ctld_port - 1
        (folder / "slurm.conf").write_text(_config(folder, node, cpus, ctld_port, slurmd_port))
        _quiet([_program("mungekey"), "-c", "-k", str(folder / "munge.key")])
        _quiet([
            _program("munged"), "--force", f"--socket={folder}/munge.sock", f"--key-file={folder}/munge.key",
            f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
        ])
        cluster.pids["munged"] = _read_pid(folder / "munged.pid", timeout)
        env = cluster.env
        _quiet([_program("slurmctld"), "-i"], env=env)
        cluster.pids["slurmctld"] = _read_pid(folder / "slurmctld.pid", timeout)
        _quiet([_program("slurmd")], env=env)
        cluster.pids["slurmd"] = _read_pid(folder / "slurmd.pid", timeout)
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
        state = done.stdout.strip()
        if state.startswith("idle"):
            return
        time.sleep(0.2)
    raise SlurmUnavailable(
        f"the node is {state or 'unknown'} after {timeout:g} s, not idle; slurmd's log ends: "
        + cluster.log("slurmd")[-800:]
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
