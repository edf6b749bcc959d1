"""Ranks that disagree, or one that leaves mid-fit, get clear errors instead of hanging (a rank
killed mid-fit, or one that raises, is test_planted_errors.py's)."""

import time

import pytest
from launch import run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", ["model", "steps"])
def test_ranks_that_disagree_get_a_clear_error(case: str, backend: str) -> None:
    start = time.monotonic()
    result = run("mismatch_job", 2, case, timeout=140, check=False, env={"TNT_TIMEOUT_S": "30"}, backend=backend)
    assert result.returncode != 0
    errors = [r.get("error") or "" for r in result.ranks]
    assert all(errors), (errors, result.output[-3000:])  # every rank raised: nobody hangs or goes on
    if case == "model":
        for e in errors:
            assert "ValueError: tnt: the ranks hold different model and optimizer variables" in e, e
            assert "rank 1 has" in e and "same model" in e, e
    else:
        explained = [e for e in errors if "fell out of step in fit" in e and "tnt_distribute_dataset=False" in e]
        assert explained, errors
        # The type is tnt_comm's (on TensorFlow, TensorFlow's error is its cause), with its data: the other rank
        # to blame, and both sides' calls.
        assert any(e.startswith("tnt_comm._core.CollectiveMismatch:") for e in explained), explained
        for rank, data in enumerate(result.ranks):
            if (data["error"] or "").startswith("tnt_comm._core.CollectiveMismatch:"):
                fields = data["fields"]
                assert fields["ranks"] in ([0], [1]), (rank, fields)
                assert fields["mine"] and fields["theirs"] and fields["operation"], fields
    assert time.monotonic() - start < 120


@pytest.mark.timeout(150)
def test_a_rank_that_leaves_mid_fit_raises_peer_failure_on_the_others(backend: str) -> None:
    """Inside fit, the failure surfaces as tnt_comm.PeerFailure naming the rank, not as TensorFlow's
    InternalError; the error it replaces is kept as the cause (TensorFlow's, JAX's runtime error
    around the callback that raised, or on torch tnt-comm's own, raised in the step)."""
    result = run("mismatch_job", 2, "leave", timeout=140, check=False, env={"TNT_TIMEOUT_S": "30"}, backend=backend)
    error = result.ranks[0].get("error") or ""
    expected = "tnt_comm._core.PeerFailure: tnt: fit stopped: rank 1 failed"
    assert error.startswith(expected), (error, result.output[-3000:])
    cause = {"tensorflow": "Error)", "jax": "(cause: JaxRuntimeError)"}.get(backend, "(cause: PeerFailure)")
    assert "(cause: " in error and cause in error and "cause: NoneType" not in error, error
    # ... and as data: e.ranks names the rank that left, as tnt_comm's own calls do.
    assert result.ranks[0]["fields"]["ranks"] == [1], result.ranks[0]["fields"]
