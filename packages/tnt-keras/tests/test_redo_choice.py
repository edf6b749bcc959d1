"""TNT_ELASTIC_REDO, what an elastic fit redoes after a lost rank where it could redo either the step
or the epoch (step_redo.py): "epoch" asks for the epoch, and a value it does not know is refused with
the variable and the values it takes named, before the model is looked at (in this process, no job;
the jobs of test_elastic.py redo steps on JAX with "step")."""

import pytest


def test_epoch_is_chosen_and_an_unknown_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from tnt_keras import step_redo

    monkeypatch.setenv(step_redo.REDO, "epoch")
    assert step_redo.redoes_steps(None) is False  # type: ignore[arg-type]
    monkeypatch.setenv(step_redo.REDO, "sometimes")
    with pytest.raises(ValueError, match="TNT_ELASTIC_REDO='sometimes' is not understood; set it to step or epoch"):
        step_redo.redoes_steps(None)  # type: ignore[arg-type]
