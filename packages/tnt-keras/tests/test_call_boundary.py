"""The rules by which survivors of a re-formed elastic job find the call each is in
(``tnt_keras/call_boundary.py``), one process: the agreement's allreduce is replaced by what the
other survivors would contribute. The multi-rank cases are test_elastic.py's ``between-calls``."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SOURCE = Path(__file__).parents[1] / "src" / "tnt_keras" / "call_boundary.py"


@pytest.fixture
def boundary(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    """A fresh copy of the module (loaded from its file, without tnt_keras' package, which imports
    Keras and a backend this module needs neither of), whose allreduce takes the minimum of this
    rank's part and those of the other survivors named as (closed, closing)."""

    def make(*others: tuple[int, bool]) -> ModuleType:
        spec = importlib.util.spec_from_file_location("call_boundary_under_test", SOURCE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        parts = [np.array([c, -c, int(closing)], np.int64) for c, closing in others]

        def allreduce(x: np.ndarray, op: str = "sum") -> np.ndarray:
            assert op == "min"
            if len(x) == 1:  # the closing collective: a failure where the test says so
                if module.fail_closing:
                    raise ConnectionError("a rank was lost in the closing collective")
                return x
            return np.min(np.stack([x, *parts]), axis=0)

        module.fail_closing = False
        monkeypatch.setattr(module.tnt_comm, "allreduce", allreduce)
        return module

    return make


def lost_in_closing(module: ModuleType) -> None:
    module.fail_closing = True
    with pytest.raises(ConnectionError):
        module.close()
    module.fail_closing = False


def test_a_call_that_closes_is_counted(boundary: Callable[..., ModuleType]) -> None:
    module = boundary()
    module.close()
    module.close()
    assert module.closed() == 2


def test_survivors_in_the_same_call_recover_it(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((0, True), (0, False))  # one other survivor closing, one still in the call
    lost_in_closing(module)
    module.agree()  # returns: the call's own recovery follows
    assert module.closed() == 0
    module.agree()  # the next re-forming: this rank is no longer closing
    assert module.closed() == 0


def test_a_survivor_closing_a_call_another_finished_returns(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((1, False), (0, True))
    lost_in_closing(module)
    with pytest.raises(module.Behind):
        module.agree()
    assert module.closed() == 1  # as if the closing collective had passed


def test_every_survivor_closing_returns(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((0, True), (0, True))
    lost_in_closing(module)
    with pytest.raises(module.Behind):
        module.agree()
    assert module.closed() == 1


def test_a_survivor_in_a_call_the_others_have_not_begun_begins_it_again(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((0, True))
    module.close()
    with pytest.raises(module.Ahead):
        module.agree()
    assert module.closed() == 1


def test_a_survivor_behind_outside_a_closing_collective_is_an_error(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((1, False))
    with pytest.raises(RuntimeError, match="had closed 0 to 1 calls .this one 0, outside a closing"):
        module.agree()


def test_survivors_two_calls_apart_are_an_error(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((0, True))
    module.close()
    module.close()
    with pytest.raises(RuntimeError, match="same calls to fit, evaluate and predict, in the same order"):
        module.agree()


def test_a_replacement_takes_the_count_it_joins_at(boundary: Callable[..., ModuleType]) -> None:
    module = boundary((3, False))
    module.joined(3)
    module.agree()  # level with the others
    assert module.closed() == 3


def test_a_call_inside_another_is_part_of_it(boundary: Callable[..., ModuleType]) -> None:
    module = boundary()
    with module.nested() as inside_outer:
        with module.nested() as inside_inner:
            assert (inside_outer, inside_inner) == (False, True)
    with module.nested() as inside_again:
        assert not inside_again
