import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The costliest first, so that pytest-xdist's workers do not end on them one after the other:
# test_schedules.py's random programs take 30-50 s each on 2 cores.
FIRST = ["test_schedules.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: 0 if item.path.name in FIRST else 1)
