"""Elastic fits (tnt-launch --elastic): ranks are killed (SIGKILL) inside a real job, during a
training step, at an epoch's end, during the validation of an epoch and during a later evaluate,
rank 0 and two ranks at once among them; the survivors re-form the job, train the epoch again and
end with what serial Keras ends with on the same global batches: weights and optimizer state,
every epoch's logs in History, and the evaluate's results. Fewer ranks left than --elastic asks for
end the job as a lost rank does without it."""

import pytest
from conftest import skip_unless_installed
from launch import _launch
from test_training import TOL

pytestmark = pytest.mark.by_backend

# (kills as elastic_job.py takes them, the members that are left), on the backends each runs on:
# torch all of them, TensorFlow and JAX the two commonest (a step, and rank 0 at an epoch's end).
SCENARIOS = {
    "step": (["1@1:batch:2"], [0, 2, 3]),
    "rank-0-epoch-end": (["0@2:epoch_end"], [1, 2, 3]),
    "two-in-validation": (["2@1:validation:1", "3@1:validation:1"], [0, 1]),
    "evaluate": (["1@0:evaluate:1"], [0, 2, 3]),
}
CASES = [("torch", name) for name in SCENARIOS] + [
    (backend, name) for backend in ("tensorflow", "jax") for name in ("step", "rank-0-epoch-end")
]


def close(got: float, want: float) -> bool:
    """Equal up to TOL relative to the value (8 ulps of float32: the sums differ only in order)."""
    return abs(got - want) <= TOL * max(1.0, abs(want))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "scenario"), CASES, ids=[f"{b}-{s}" for b, s in CASES])
def test_an_elastic_fit_that_loses_ranks_equals_serial_training(backend: str, scenario: str) -> None:
    skip_unless_installed(backend)
    kills, survivors = SCENARIOS[scenario]
    result = _launch("elastic_job", 4, tuple(kills), timeout=280, backend=backend,
                     launcher_args=("--elastic", "2", "--timeout", "30"))
    assert f"finished on {len(survivors)} of 4 rank(s)" in result.output, result.output[-4000:]
    reports = [result.ranks[m] for m in survivors]
    for report in reports:
        assert report, result.output[-4000:]
        assert report["members"] == survivors and report["size"] == len(survivors) and report["generation"] >= 1
        assert report["epochs"] == report["serial_epochs"] == [0, 1, 2, 3]
        assert report["variables_error"] <= TOL * max(1.0, report["scale"]), report
        for key, values in report["serial_history"].items():
            got = report["history"][key]
            assert len(got) == len(values) and all(map(close, got, values)), (key, got, values)
        for key, value in report["serial_evaluated"].items():
            assert close(report["evaluated"][key], value), (key, report["evaluated"], report["serial_evaluated"])
    for victim in set(range(4)) - set(survivors):
        assert f"rank {victim} (host localhost, local rank {victim}) is lost" in result.output


@pytest.mark.timeout(300)
def test_fewer_ranks_left_than_elastic_asks_for_ends_the_job() -> None:
    result = _launch("elastic_job", 4, ("1@1:batch:1", "2@1:batch:1"), timeout=280, backend="torch",
                     launcher_args=("--elastic", "3", "--timeout", "30"), check=False)
    assert result.returncode != 0, result.output[-4000:]
    assert "failed" in result.output and "killed by signal 9" in result.output, result.output[-4000:]
    assert not any(result.ranks), "no rank may finish the fit"
