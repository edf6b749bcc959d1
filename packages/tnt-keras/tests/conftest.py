import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# tnt-comm's rank spawner (ranks.py) serves these tests too, for jobs that need no launcher.
sys.path.insert(0, str(HERE.parents[1] / "tnt-comm" / "tests"))

# Seconds each test file keeps one worker busy on 2 cores (`pytest -n 2 --dist loadfile
# --durations=0`, 2026-11-27, both backends; the files whose tests changed since, estimated from
# their jobs' times). With --no-loadscope-reorder (nox passes it) pytest-xdist hands out whole files
# in collection order, so the costliest go first and the light ones fill in at the end: by the
# number of tests per file (xdist's own order) one worker idled for the last 30 s of a 331 s run.
FILE_SECONDS = {
    "test_training.py": 216,
    "test_large_models.py": 139,
    "test_ops.py": 127,
    "test_data.py": 114,
    "test_saving.py": 112,
    "test_failures.py": 107,
    "test_predict.py": 72,
    "test_files.py": 61,
    "test_callbacks.py": 61,
    "test_save_failures.py": 54,
    "test_optimizers.py": 31,
    "test_progbar.py": 28,
    "test_progress_tty.py": 28,
    "test_torch_inputs.py": 23,
    "test_prebuilt_op.py": 21,
    "test_wrapper.py": 18,
    "test_slicing.py": 9,
    "test_buckets.py": 5,
}
NEW_FILE_SECONDS = 20  # a file not measured yet goes among the middling ones


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: each file's tests keep their order.
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, NEW_FILE_SECONDS))


@pytest.fixture(scope="session")
def tf() -> ModuleType:
    """TensorFlow, for the tests that use it in pytest's own process. Imported here, by the first
    test that asks, and not at the top of their files: every xdist worker collects every file, and
    each would pay the import (3 CPU-s, 4 s of the session's start on 2 cores) for tests that only
    one of them runs."""
    import tensorflow

    return tensorflow


BACKENDS = ("tensorflow", "torch")


def skip_unless_installed(backend: str) -> None:
    """Skips the calling test, saying why, where ``backend``'s framework is missing (nox installs
    both: noxfile.py, TORCH)."""
    import importlib.util

    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed (pip install torch==2.13.0, or nox's keras session)")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The Keras backend a test's ranks run on (KERAS_BACKEND): the tests that take it run on each,
    skipping where its framework is missing."""
    skip_unless_installed(request.param)
    return request.param
