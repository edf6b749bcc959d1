"""A cluster inside one machine: hosts as network namespaces, each with its own address and sshd.

Every host is a namespace with one veth link to a bridge that lives in a namespace of its own (the
switch), so the cluster touches nothing of the machine's own network: all its addresses (in
198.18.0.0/15, the range reserved for benchmarking) belong to namespaces it created. Links can be
shaped with ``tc netem`` (rate, delay, loss) and cut (``cut``). As on a real cluster, every host has
its own /dev/shm and its own tnt-launch job registry (/tmp/tnt-launch-UID), while the rest of the
file system is shared. A host's namespaces are those of its sshd: ``command`` enters them.

As a script (as root):

    python integration/netns_cluster.py up --hosts 3 [--rate 1gbit --delay 50us] --state /tmp/c.json
    python integration/netns_cluster.py run --state /tmp/c.json 0 -- tnt-launch --hostfile ... -- x.py
    python integration/netns_cluster.py down --state /tmp/c.json

``up`` prints the hostfile, the ssh options for ``TNT_SSH_OPTS`` and how to run a command on host
0; ``down`` stops the sshds it started (by PID) and deletes the namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SUBNET = "198.18.0"  # RFC 2544's benchmarking range; hosts get .1, .2, ...
SSHD = "/usr/sbin/sshd"


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster (not root, no namespaces, no sshd); says why."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return done


def missing_requirements() -> str | None:
    """Why a cluster cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    for tool in ("ip", "tc", "ssh", "ssh-keygen", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install iproute2 openssh-client util-linux)"
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (Debian: apt-get install openssh-server)"
    probe = f"tntprobe{secrets.token_hex(3)}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Cluster:
    """A running cluster; ``hosts[i]`` is the namespace of host i, reachable at ``address(i)``."""

    prefix: str
    hosts: list[str]
    switch: str
    folder: str  # keys, sshd configs and logs
    sshd_pids: list[int] = field(default_factory=list)
    ssh_options: str = ""

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def hostfile(self, path: Path, slots: int) -> Path:
        path.write_text("".join(f"{self.address(i)} slots={slots}\n" for i in range(len(self.hosts))))
        return path

    def command(self, host: int, argv: list[str]) -> list[str]:
        """``argv`` run on ``host``: in the network and mount namespaces of its sshd."""
        return ["nsenter", "-t", str(self.sshd_pids[host]), "-n", "-m", "--", *argv]

    def path(self, host: int, path: str) -> Path:
        """Where ``path`` as ``host`` sees it can be read from here (its own /dev/shm, registry)."""
        return Path(f"/proc/{self.sshd_pids[host]}/root") / path.lstrip("/")

    def shape(self, host: int, rate: str | None = None, delay: str | None = None, loss: str | None = None) -> None:
        """Shapes what ``host`` sends and what the switch sends to it (both directions): a rate alone
        with a token bucket (``tbf``), delay or loss with ``netem`` (a kernel module some kernels lack)."""
        if delay or loss:
            args = ["netem", *(["delay", delay] if delay else []), *(["loss", loss] if loss else [])]
            args += ["rate", rate] if rate else []
        elif rate:
            # veth hands over 64 KiB segments (GSO): the bucket must hold several of them.
            args = ["tbf", "rate", rate, "burst", "512kb", "latency", "50ms"]
        else:
            return
        for netns, dev in ((self.hosts[host], "eth0"), (self.switch, f"p{host}")):
            tc = ["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev, "root", *args]
            done = subprocess.run(tc, capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                raise ClusterUnavailable(f"cannot shape links with tc {args[0]}: {done.stderr.strip()}")

    def cut(self, host: int) -> None:
        """Cuts ``host`` off the switch, as a pulled cable would (no packet, no reset)."""
        _ip("link", "set", f"p{host}", "down", netns=self.switch)

    def reconnect(self, host: int) -> None:
        """Undoes ``cut``."""
        _ip("link", "set", f"p{host}", "up", netns=self.switch)

    def down(self) -> None:
        for pid in self.sshd_pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for pid in self.sshd_pids:
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        # What still runs on the hosts outlived its sshd: the session of a connection that a cut link
        # left open waits for a FIN that never comes. Ours too, so it goes before its namespace.
        namespaces = [*self.hosts, self.switch]
        stayed = _processes_in(namespaces)
        if stayed:
            print(f"netns cluster {self.prefix}: ending {len(stayed)} processes that outlived their sshd: {stayed}")
        for pid in stayed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in stayed):
            time.sleep(0.05)
        left = [pid for pid in stayed if _alive(pid)]
        for netns in namespaces:
            _ip("netns", "del", netns, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
        if left:
            raise RuntimeError(f"processes on the cluster's hosts survived SIGKILL: {left}")


def _processes_in(namespaces: list[str]) -> list[int]:
    """The processes whose network namespace is one of ``namespaces`` (live ones, not zombies)."""
    pids = []
    for netns in namespaces:
        done = _ip("netns", "pids", netns, check=False)
        pids += [int(p) for p in done.stdout.split()] if done.returncode == 0 else []
    return [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    """Running, and not a zombie: a child of ours is reaped here, one that init has yet to reap
    (a session orphaned by its sshd) is gone for our purpose."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def up(hosts: int, rate: str | None = None, delay: str | None = None, loss: str | None = None) -> Cluster:
    """Builds the cluster, or raises ``ClusterUnavailable`` (and leaves nothing behind)."""
    reason = missing_requirements()
    if reason:
        raise ClusterUnavailable(reason)
    prefix = f"tnt{secrets.token_hex(3)}"
    cluster = Cluster(prefix, [f"{prefix}h{i}" for i in range(hosts)], f"{prefix}sw", tempfile.mkdtemp(prefix=prefix))
    try:
        _build(cluster)
        for i in range(hosts):
            cluster.shape(i, rate, delay, loss)
        _start_sshds(cluster)
    except BaseException:
        cluster.down()
        raise
    return cluster


def _build(c: Cluster) -> None:
    _ip("netns", "add", c.switch)
    _ip("link", "add", "br0", "type", "bridge", netns=c.switch)
    _ip("link", "set", "br0", "up", netns=c.switch)
    for i, netns in enumerate(c.hosts):
        _ip("netns", "add", netns)
        _ip("link", "set", "lo", "up", netns=netns)
        # Both ends are made in the host's namespace (names are local there), then one moves.
        _ip("link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", netns=netns)
        _ip("link", "set", f"p{i}", "netns", c.switch, netns=netns)
        _ip("addr", "add", f"{c.address(i)}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", f"p{i}", "master", "br0", netns=c.switch)
        _ip("link", "set", f"p{i}", "up", netns=c.switch)


def _start_sshds(c: Cluster) -> None:
    folder = Path(c.folder)
    for name in ("host_key", "client_key"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True, capture_output=True
        )
    (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
    os.chmod(folder / "authorized_keys", 0o600)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    user = os.environ.get("USER") or "root"
    c.ssh_options = (
        f"-i {folder / 'client_key'} -F /dev/null -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    )
    for i in range(len(c.hosts)):
        config = folder / f"sshd{i}.conf"
        config.write_text(
            f"Port 22\nListenAddress {c.address(i)}\nHostKey {folder / 'host_key'}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile none\nAllowUsers {user}\n"
            "StrictModes no\nPermitRootLogin yes\nUsePAM no\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nX11Forwarding no\n"
            "MaxStartups 10:30:100\nLogLevel ERROR\n"
        )
        log = open(folder / f"sshd{i}.log", "w")  # noqa: SIM115 - the server writes it until down()
        # A private /dev/shm and job registry for this host, mounted in a mount namespace of its own
        # that everything the sshd starts inherits (every command goes through exec: one PID).
        registry = f"/tmp/tnt-launch-{os.getuid()}"
        os.makedirs(registry, mode=0o700, exist_ok=True)
        private = (
            "mount -t tmpfs -o mode=1777 tnt-shm /dev/shm && "
            f"mount -t tmpfs -o mode=700 tnt-registry {registry} && "
            f'exec {SSHD} -D -e -f "$0"'
        )
        argv = ["ip", "netns", "exec", c.hosts[i], "unshare", "--mount", "--propagation", "private"]
        server = subprocess.Popen([*argv, "sh", "-c", private, str(config)], stdout=log, stderr=log)
        log.close()
        c.sshd_pids.append(server.pid)
    # Every host reaches every other one: probe from host 0 (and host 1 back to host 0).
    pairs = [(0, j) for j in range(1, len(c.hosts))] + ([(1, 0)] if len(c.hosts) > 1 else [])
    for src, dst in pairs:
        deadline = time.monotonic() + 20
        while True:
            argv = [
                "ssh",
                *c.ssh_options.split(),
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=3",
                c.address(dst),
                "true",
            ]
            probe = subprocess.run(c.command(src, argv), capture_output=True, text=True, timeout=30, check=False)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                logs = " ".join((folder / f"sshd{i}.log").read_text().strip() for i in range(len(c.hosts)))
                raise ClusterUnavailable(f"host {src} cannot ssh to host {dst}: {probe.stderr.strip()} {logs}")
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    p_up = sub.add_parser("up", help="build a cluster and write its state file")
    p_up.add_argument("--hosts", type=int, default=2)
    p_up.add_argument("--rate", help="link rate, e.g. 1gbit")
    p_up.add_argument("--delay", help="one-way delay, e.g. 50us")
    p_up.add_argument("--loss", help="packet loss, e.g. 1%%")
    p_down = sub.add_parser("down", help="tear a cluster down")
    p_run = sub.add_parser("run", help="run a command on a host")
    for p in (p_up, p_down, p_run):
        p.add_argument("--state", required=True, help="the cluster's state file (JSON)")
    p_run.add_argument("host", type=int)
    p_run.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    state = Path(args.state)
    if args.action == "up":
        try:
            cluster = up(args.hosts, args.rate, args.delay, args.loss)
        except ClusterUnavailable as e:
            print(f"netns_cluster: {e}", file=sys.stderr)
            return 2
        state.write_text(json.dumps(asdict(cluster)))
        hostfile = cluster.hostfile(Path(cluster.folder) / "hostfile", 2)
        print(f"hostfile: {hostfile}\nTNT_SSH_OPTS='{cluster.ssh_options}'")
        print(f"on host 0: ip netns exec {cluster.hosts[0]} COMMAND, or {sys.argv[0]} run --state {state} 0 -- COMMAND")
        return 0
    cluster = Cluster(**json.loads(state.read_text()))
    if args.action == "down":
        cluster.down()
        state.unlink()
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    env = dict(os.environ, TNT_SSH_OPTS=cluster.ssh_options)
    return subprocess.run(cluster.command(args.host, command), env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
