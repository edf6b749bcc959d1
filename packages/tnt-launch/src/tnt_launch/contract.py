"""The environment contract, which lives in tnt-comm (``tnt_comm/contract.py``): loaded here from
tnt-comm's installed files by path, without importing the ``tnt_comm`` package, so that the launcher
never loads tnt-comm's compiled library (a login node needs only its files). ``from tnt_launch import
contract`` gives that module itself; its source is also what the agents receive (agents.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _contract_path() -> Path:
    spec = importlib.util.find_spec("tnt_comm")  # a top-level package's spec: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "tnt-launch needs tnt-comm installed beside it (the environment contract lives there): "
            "pip install ./packages/tnt-comm"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "contract.py"


def _load() -> None:
    spec = importlib.util.spec_from_file_location(__name__, _contract_path())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module  # the import system hands out the contract module in this one's place
    spec.loader.exec_module(module)


_load()
