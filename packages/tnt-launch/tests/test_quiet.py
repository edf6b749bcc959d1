"""Quiet by default: TensorFlow's start-up lines and the GPU warning only where they matter."""

from __future__ import annotations

import pytest

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
