"""Which call each survivor is in when an elastic job re-forms: a rank lost at the boundary between
two of tnt's calls (``fit`` then ``evaluate``, ``evaluate`` then ``predict``, ...).

The last collective of a call can complete on one rank and fail on another: a survivor may have
left ``fit`` for the ``evaluate`` that follows while another still waits in ``fit``'s last sum.
Each would then recover its own call, and their collectives would not match. So in an elastic job
every call ends with one more collective, its closing one (``close``): once any rank has passed it,
every rank had entered it, that is, had finished all of the call's work. The first collective after
every re-forming is one agreement (``agree``) on how many calls each survivor has closed and whether
it is in a closing collective:

- a survivor that closed fewer calls than another is in the closing collective of the call the
  other finished: its own result of that call is whole, and it returns it (``Behind``);
- a survivor that closed more calls than another is in the next call, which the others have not
  begun: it had done nothing there that another rank saw, and begins that call afresh (``Ahead``);
- where every survivor closed as many and all are in the closing collective, each returns too
  (``Behind``); otherwise they recover the call they are all in, as the call's own rules say
  (``elastic.py``, ``step_redo.py``).

Calls made inside another (a ``predict`` in a callback of ``fit``) are part of the outer call: they
neither close nor recover on their own (``nested``). A replacement learns the count when it joins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import tnt_comm

_closed = 0  # the calls this process has closed (their closing collective passed), in this job
_closing = False  # inside a closing collective that has not passed (or failed, before the agreement)
_depth = 0  # tnt calls under way on this thread of control: 1 in a call, 2 in one inside it


class Behind(Exception):
    """Every survivor had finished the call this rank was closing when the job re-formed: the call
    returns its result (not an error: the call's wrapper catches it)."""

    def __init__(self) -> None:
        super().__init__("every rank had finished this call when the job re-formed; it returns")


class Ahead(Exception):
    """This rank was in a call the other survivors had not begun when the job re-formed: the call
    begins afresh (not an error: the call's wrapper catches it)."""

    def __init__(self) -> None:
        super().__init__("the other ranks had not begun this call when the job re-formed; it begins again")


def closed() -> int:
    """How many calls this process has closed in the job."""
    return _closed


def joined(count: int) -> None:
    """A replacement joins a job that has closed ``count`` calls (from rank 0, as it joins)."""
    global _closed
    _closed = count


@contextlib.contextmanager
def nested() -> Iterator[bool]:
    """Around one of tnt's calls; yields whether it runs inside another call, whose part it is."""
    global _depth
    _depth += 1
    try:
        yield _depth > 1
    finally:
        _depth -= 1


def _closing_collective(count: int) -> None:
    """Every rank's count, one small allreduce: it passes on a rank only once every rank entered it."""
    tnt_comm.allreduce(np.array([count], np.int64), op="min")


def close() -> None:
    """The closing collective of a call in an elastic job. Raises tnt-comm's failure where a rank
    is lost in it; the re-forming that follows (``agree``) says whether the call is done."""
    global _closed, _closing
    _closing = True
    _closing_collective(_closed)
    _closing, _closed = False, _closed + 1


def agree() -> None:
    """The survivors' first collective after a re-forming (collective over them). Returns where they
    are all in the same call and recover it; raises ``Behind`` where this rank's call is done,
    ``Ahead`` where it begins afresh."""
    global _closed, _closing
    mine = np.array([_closed, -_closed, int(_closing)], np.int64)
    fewest, most, all_closing = (int(v) for v in tnt_comm.allreduce(mine, op="min"))
    most = -most
    closing, _closing = _closing, False
    if most - fewest > 1 or (_closed < most and not closing):  # a closing collective passed without this rank
        raise RuntimeError(
            f"tnt: when the job re-formed after a lost rank, its ranks had closed {fewest} to {most} calls "
            f"(this one {_closed}, {'in' if closing else 'outside'} a closing collective): every rank must "
            "make the same calls to fit, evaluate and predict, in the same order"
        )
    if _closed < most or (_closed == fewest == most and all_closing):
        _closed += 1
        raise Behind()
    if _closed > fewest:
        raise Ahead()
