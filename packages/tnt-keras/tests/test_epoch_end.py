"""The journal of an elastic fit's epoch end (tnt_keras/epoch_end.py), in one process: an entry whose
making holds collectives of its own (a callback's evaluate or predict) is written down once, as one;
where a rank is lost in it, it is taken from the survivor that finished it, or made again."""

from __future__ import annotations

import pytest
import tnt_comm
from tnt_keras import epoch_end


@pytest.fixture
def journal(monkeypatch: pytest.MonkeyPatch) -> epoch_end.Journal:
    opened = epoch_end.Journal(recover=lambda error: 0)  # survivor 0 holds the most results
    opened.open(2)
    monkeypatch.setattr(epoch_end, "active", opened)
    return opened


def lost() -> tnt_comm.PeerFailure:
    return tnt_comm.PeerFailure("rank 1 is lost")


def test_an_entry_holds_the_collectives_made_inside_it(journal: epoch_end.Journal) -> None:
    inner = []

    def predict() -> str:
        assert not epoch_end.journaling()  # its own collectives are part of it
        inner.append(epoch_end.collective(lambda: "a gather"))
        return "predictions"

    assert epoch_end.journaling()
    assert epoch_end.collective(lambda: "averaged logs") == "averaged logs"
    assert epoch_end.collective(predict) == "predictions"
    assert journal.entries == ["averaged logs", "predictions"] and inner == ["a gather"]
    assert epoch_end.journaling()


def test_an_entry_no_survivor_finished_is_made_again(journal: epoch_end.Journal) -> None:
    tries = []

    def predict() -> str:
        tries.append(len(tries))
        if len(tries) == 1:
            raise lost()
        return "predictions"

    assert epoch_end.collective(predict) == "predictions"  # made again, on the ranks left
    assert tries == [0, 1] and journal.entries == ["predictions"] and not journal.making


def test_an_entry_a_survivor_finished_is_taken_from_it(journal: epoch_end.Journal, monkeypatch) -> None:
    # Survivor 0 had finished the predict and gone on: its results are handed on (one broadcast).
    monkeypatch.setattr(epoch_end, "broadcast_object", lambda value, root: ["averaged logs", "its predictions"])
    tries = []

    def predict() -> str:
        tries.append(1)
        raise lost()

    assert epoch_end.collective(lambda: "averaged logs") == "averaged logs"
    assert epoch_end.collective(predict) == "its predictions"
    assert tries == [1] and journal.entries == ["averaged logs", "its predictions"]
