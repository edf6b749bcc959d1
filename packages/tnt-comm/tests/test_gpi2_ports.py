"""GPI-2's ports: a job that leaves the base to tnt-comm gets one nobody else has claimed.

Rank 0 picks the base. A port that is free says nothing of a job that picked it a moment ago and has
not bound it yet, so whoever picks a base claims it first: one abstract Unix socket per block of 8
ports, "tnt-gpi2-ports:<first port>" (src/transport/gpi2_ports.hpp; tnt-launch claims the same
names). Two jobs starting together on one host once picked one base, and one of them failed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tnt_comm

pytestmark = pytest.mark.skipif(
    "gpi2" not in tnt_comm.build_info()["transports"],
    reason="this tnt_comm has no GPI-2 transport: build it with GPI2_ROOT set (docs/comm.md)",
)
pytest.importorskip("psutil")  # the ranks list their own listening ports

TESTS = Path(__file__).resolve().parent

RANK_CODE = """
import os, socket
import numpy as np, psutil, tnt_comm as tc
tc.init()
# The GPI-2 ports this rank listens on, and whether the claim on the base is still held.
mine = sorted(c.laddr.port for c in psutil.Process().net_connections("tcp")
              if c.status == psutil.CONN_LISTEN and 10240 <= c.laddr.port < 32768)
with socket.socket(socket.AF_UNIX) as probe:
    try:
        probe.bind("\\0tnt-gpi2-ports:" + os.environ["EXPECTED_BASE"])
        held = False
    except OSError:
        held = True
y = tc.allreduce(np.full(8, tc.rank() + 1, np.float32))
print(" ".join(map(str, mine)), held, float(y[0]), flush=True)
"""

# Runs in a network namespace of its own: claiming every base there leaves the jobs of the tests
# beside (they share this host's ports and claims otherwise) a whole range of their own.
DRIVER = """
import json, random, resource, socket, sys
from pathlib import Path
sys.path.insert(0, TESTS)
from ranks import Job

# The range rank 0 picks bases from: multiples of 8 whose three offsets stay below 32768.
LOW, HIGH, BLOCK, OFFSETS = 10240, 32768 - 512 - 256, 8, (0, 256, 512)
# Claim every block of the range but the three of one base: however rank 0 starts its search,
# that base is the only one it may take (all ports are free in a new namespace).
base = random.SystemRandom().randrange(LOW, HIGH, BLOCK)
spared = {base + o for o in OFFSETS}
blocks = [b for b in range(LOW, HIGH + 512, BLOCK) if b not in spared]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
needed = len(blocks) + 256
if hard != resource.RLIM_INFINITY and hard < needed:
    print(json.dumps({"skip": f"claiming every block needs {needed} descriptors; the limit is {hard}"}))
    sys.exit(0)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), hard))
held = []
for b in blocks:
    s = socket.socket(socket.AF_UNIX)
    s.bind("\\0tnt-gpi2-ports:" + str(b))
    held.append(s)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the ranks start with the usual limit
job = Job(2, RANK_CODE, Path(TMP), env={"TNT_TRANSPORT": "gpi2", "EXPECTED_BASE": str(base)})
results = job.wait(80)
print(json.dumps({"base": base, "results": [[r.returncode, r.stdout, r.stderr[-3000:]] for r in results]}))
"""


def in_own_network(tmp: Path) -> dict:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip to give the test a network of its own (Debian: util-linux, iproute2)")
    probe = subprocess.run(["unshare", "--net", "true"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (unshare --net: {probe.stderr.strip()})")
    script = tmp / "driver.py"
    header = f"TESTS = {str(TESTS)!r}\nTMP = {str(tmp)!r}\nRANK_CODE = {RANK_CODE!r}\n"
    script.write_text(header + textwrap.dedent(DRIVER))
    done = subprocess.run(
        ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$1"', sys.executable, str(script)],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    return report


@pytest.mark.timeout(150)
def test_rank_0_picks_the_one_base_nobody_claims_and_holds_it_while_gpi2_runs(tmp_path: Path) -> None:
    report = in_own_network(tmp_path)
    base = report["base"]
    ethernet = tnt_comm.build_info()["gpi2"]["network"] == "ethernet"
    for r, (returncode, stdout, stderr) in enumerate(report["results"]):
        assert returncode == 0, f"rank {r} exited {returncode}:\n{stderr}"
        *ports, claimed, total = stdout.split()
        # GPI-2's service port at base+socket, and over Ethernet its device's at base+512+socket
        # (its topology port, base+256+socket, is closed once it started).
        expected = {base + r, base + 512 + r} if ethernet else {base + r}
        assert expected <= {int(p) for p in ports}, (base, stdout)
        # Rank 0 claimed the base for the job and still holds it.
        assert claimed == "True", stdout
        assert float(total) == 3.0
