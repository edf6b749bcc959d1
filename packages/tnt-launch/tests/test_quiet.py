"""Quiet by default: TensorFlow's start-up lines and the GPU warning only where they matter."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Launcher

from tnt_launch.config import LaunchConfig
from tnt_launch.display import environment_rows
from tnt_launch.hosts import Host
from tnt_launch.plan import HostFacts, JobIdentity, Plan, build_plan

ID = JobIdentity("0123456789ab", "f" * 32, 29500)
LOCAL = [Host("localhost", local=True)]
REMOTE = [Host("127.0.0.1", local=True), Host("127.0.0.2")]


def plan(
    hosts: list[Host] = LOCAL,
    facts: dict[str, HostFacts] | None = None,
    environ: dict[str, str] | None = None,
    **kw: object,
) -> Plan:
    kw.setdefault("script", "train.py")
    kw.setdefault("python_interpreter", ("/usr/bin/python3",))
    config = LaunchConfig(**kw)  # type: ignore[arg-type]
    host_facts = facts or {h.name: HostFacts(cpus=4) for h in hosts}
    return build_plan(config, hosts, host_facts, ID, environ or {})


def tf_levels(p: Plan) -> list[str | None]:
    return [spec.env.get("TF_CPP_MIN_LOG_LEVEL") for spec in p.ranks]


def test_tf_start_up_lines_are_hidden_by_default() -> None:
    p = plan(REMOTE, no_gpu=True)
    assert tf_levels(p) == ["2", "2"]
    assert dict(environment_rows(p))["TF_CPP_MIN_LOG_LEVEL"] == "2"


@pytest.mark.parametrize("level", ["WARNING", "INFO", "ERROR"])
def test_tf_stays_quiet_below_debug(level: str) -> None:
    assert tf_levels(plan(no_gpu=True, log_level=level)) == ["2"]


def test_debug_shows_tf_start_up_lines() -> None:
    assert tf_levels(plan(REMOTE, no_gpu=True, log_level="DEBUG")) == ["0", "0"]
    exported = plan(no_gpu=True, exports=(("TNT_LOG_LEVEL", "debug"),))
    assert tf_levels(exported) == ["0"]


def test_a_value_in_the_environment_is_respected() -> None:
    environ = {"TF_CPP_MIN_LOG_LEVEL": "1"}
    p = plan(REMOTE, environ=environ, no_gpu=True, log_level="DEBUG")
    # This host's rank inherits it; the other host's rank gets it carried.
    assert tf_levels(p) == [None, "1"]


def test_a_value_given_with_x_is_respected() -> None:
    p = plan(REMOTE, no_gpu=True, exports=(("TF_CPP_MIN_LOG_LEVEL", "3"),))
    assert tf_levels(p) == ["3", "3"]
    p = plan(no_gpu=True, log_level="DEBUG", exports=(("TF_CPP_MIN_LOG_LEVEL", "1"),))
    assert tf_levels(p) == ["1"]


def test_no_gpus_anywhere_gives_no_warning() -> None:
    p = plan(REMOTE)
    assert {s.device for s in p.ranks} == {"CPU"}
    assert p.warnings == ()
    assert len(p.notes) == 1 and "no GPUs found on 127.0.0.2" in p.notes[0]


def test_unused_gpus_still_warn() -> None:
    facts = {"127.0.0.1": HostFacts(gpus=("0",), cpus=4), "127.0.0.2": HostFacts(cpus=4)}
    p = plan(REMOTE, facts)
    assert {s.device for s in p.ranks} == {"CPU"}
    assert p.notes == ()
    assert p.warnings == (
        (
            "running all ranks on CPUs: no GPUs found on 127.0.0.2 "
            "(--no-gpu runs on CPUs without this warning)"
        ),
    )
    more_ranks = plan(facts={"localhost": HostFacts(gpus=("0",), cpus=4)}, nprocs=2)
    assert "localhost has 1 GPU(s) for 2 rank(s)" in more_ranks.warnings[0]


# What TensorFlow 2.21 printed on AMD EPYC machines (with and without AVX-512), once per rank.
TF_START_UP = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    (b"I0000 00:00:1795742855.898151   13987 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to "
    b"use available CPU instructions in performance-critical operations.\n"),
    (b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
    b"appropriate compiler flags.\n"),
    (b"I0000 00:00:1764100000.123456    4242 port.cc:153] oneDNN custom operations are on. You may see slightly "
    b"different numerical results due to floating-point round-off errors from different computation orders. "
    b"To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n"),
]


def test_the_known_start_up_lines_and_nothing_else_are_dropped() -> None:
    from tnt_launch.quiet import StartupFilter

    kept = [
        b"Epoch 1/3\n",
        b"W0000 00:00:1795742855.9   13987 other.cc:1] a warning TensorFlow means\n",
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR (not quite)\n",
        b"To enable the following instructions: AVX2 FMA\n",
        b"Traceback (most recent call last):\n",
    ]
    text = b"".join(TF_START_UP[:2] + kept[:2] + TF_START_UP[2:] + kept[2:] + TF_START_UP)
    for cut in (1, 7, 64, len(text)):  # however the pipe splits it
        f = StartupFilter()
        out = b"".join(f.feed(text[i : i + cut]) for i in range(0, len(text), cut)) + f.flush()
        assert out == b"".join(kept), cut


def test_partial_lines_pass_at_once() -> None:
    from tnt_launch.quiet import StartupFilter

    f = StartupFilter()
    assert f.feed(b"  3/10 [====>    ] - loss: 2.3\r") == b"  3/10 [====>    ] - loss: 2.3\r"
    assert f.feed(b"Password: ") == b"Password: "
    # One that may still become a known line waits for its end; at the end of the stream it is passed on.
    assert f.feed(b"I0000 00:00:1.5   1 cpu_feature_guard.cc:227] This Tens") == b""
    assert f.flush() == b"I0000 00:00:1.5   1 cpu_feature_guard.cc:227] This Tens"


def test_hidden_unless_debug_or_the_users_variable() -> None:
    assert plan(no_gpu=True).hide_tf_startup
    assert not plan(no_gpu=True, log_level="DEBUG").hide_tf_startup
    assert not plan(no_gpu=True, environ={"TF_CPP_MIN_LOG_LEVEL": "0"}).hide_tf_startup
    assert not plan(no_gpu=True, exports=(("TF_CPP_MIN_LOG_LEVEL", "1"),)).hide_tf_startup


@pytest.mark.timeout(60)
def test_a_job_shows_no_start_up_line(launcher: Launcher, tmp_path: Path) -> None:
    rank = tmp_path / "noisy_rank.py"
    rank.write_text(
        "import os, sys\n"
        f"lines = {TF_START_UP!r}\n"
        "out = sys.stderr.buffer\n"
        "out.write(b''.join(lines[:2]) + b'rank says hello\\n' + b''.join(lines[2:]))\n"
        "out.write(b'done ' + os.environ['TNT_RANK'].encode() + b'\\n')\n"
        "out.flush()\n"
    )
    shown = b"".join(TF_START_UP).decode()
    done = launcher.run(["-n", "2", "--no-gpu", "--output-on-all-devices", "--", sys.executable, str(rank)])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stderr.splitlines()) == ["[rank 0] done 0", "[rank 0] rank says hello",
                                                "[rank 1] done 1", "[rank 1] rank says hello"]
    # Asked for: everything, as the ranks wrote it.
    for args in (["--log-level", "DEBUG"], ["-x", "TF_CPP_MIN_LOG_LEVEL=2"]):
        done = launcher.run(["-n", "1", "--no-gpu", *args, "--", sys.executable, str(rank)])
        assert done.returncode == 0, done.stderr
        assert shown.splitlines()[0] in done.stderr and shown.splitlines()[3] in done.stderr, done.stderr
