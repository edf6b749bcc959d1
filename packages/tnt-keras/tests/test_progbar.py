"""verbose=2 with a ProgbarLogger of one's own prints every epoch once, on 1 and 2 ranks, as Keras does."""

import re

import pytest
from conftest import skip_unless_installed
from launch import run


def section(output: str, start: str, end: str) -> str:
    return output.split(f"== {start} ==", 1)[1].split(f"== {end} ==", 1)[0]


def epoch_lines(text: str, epochs: int) -> list[int]:
    """How often each "Epoch k/epochs" line appears."""
    return [len(re.findall(rf"^(?:\[rank \d+\] )?Epoch {k}/{epochs}$", text, re.M)) for k in range(1, epochs + 1)]


def summaries(text: str) -> int:
    """verbose=2 ends each epoch with one line such as "4/4 - 0s - 5ms/step - acc: ... - loss: ..."."""
    return len(re.findall(r"^(?:\[rank \d+\] )?\d+/\d+ - .*loss: ", text, re.M))


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("ranks", "backend"), [(1, "tensorflow"), (2, "tensorflow"), (2, "torch"), (2, "jax")])
def test_a_progbar_logger_of_ones_own_prints_each_epoch_once(ranks: int, backend: str) -> None:
    skip_unless_installed(backend)
    result = run("progbar_job", ranks, timeout=220, backend=backend)
    out = result.output
    plain, tnt, wrapped = section(out, "plain", "tnt"), section(out, "tnt", "wrapped"), section(out, "wrapped", "end")
    assert epoch_lines(plain, 2) == [1, 1] and summaries(plain) == 2, plain  # what Keras prints
    assert epoch_lines(tnt, 3) == [1, 1, 1] and summaries(tnt) == 3, tnt
    assert epoch_lines(wrapped, 2) == [1, 1] and summaries(wrapped) == 2, wrapped
    for r in result.ranks:
        assert r["history_returned"] and r["model_history"] and r["history_epochs"] == [0, 1, 2]
