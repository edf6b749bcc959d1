import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# tnt-comm's rank spawner (ranks.py) serves these tests too, for jobs that need no launcher.
sys.path.insert(0, str(HERE.parents[1] / "tnt-comm" / "tests"))
# tnt-launch's helpers of its tests (job_leftovers.py, pty_reader.py) serve these tests too.
sys.path.insert(0, str(HERE.parents[1] / "tnt-launch" / "tests"))

from launch import BUNDLES, SECONDS_PER_BUNDLED_JOB, bundles_enabled  # noqa: E402

# Seconds each test file keeps one worker busy on 2 cores (`pytest -n 2 --dist loadgroup
# --durations=0`, 2026-11-28, three backends), and each backend's bundled jobs (launch.BUNDLES) with
# the tests that read them. With --no-loadscope-reorder (nox passes it) pytest-xdist hands out the
# groups in collection order, so the costliest go first and the light ones fill in at the end: by
# the number of tests per file (xdist's own order) one worker idled for the last 30 s of a 331 s run.
GROUP_SECONDS = {
    # (SyncBatchNormalization's jobs joined the bundles after that run: their share is estimated.)
    "jobs-tensorflow": 480,
    "jobs-jax": 300,
    "test_training.py": 260,
    "test_large_models.py": 175,
    "jobs-torch": 170,
    "test_failures.py": 164,
    # Each backend's planted exceptions: 6 jobs of 3 ranks that cannot share their ranks.
    "test_planted_errors.py-torch": 140,
    "test_planted_errors.py-tensorflow": 92,
    "test_planted_errors.py-jax": 92,
    "test_ops.py": 139,
    "test_progress_tty.py": 80,
    "test_progbar.py": 80,
    "test_optimizers.py": 42,
    # Measured beside a CI rehearsal (2026-11-28), so rather high: 4-rank jobs that lose ranks.
    "test_elastic.py-torch": 300,
    "test_elastic.py-tensorflow": 190,
    "test_elastic.py-jax": 100,
    "test_timeline.py": 31,
    "test_imports.py": 20,
    "test_prebuilt_op.py": 13,
    "test_slicing.py": 10,
    "test_buckets.py": 6,
}
NEW_GROUP_SECONDS = 20  # a file not measured yet goes among the middling ones


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "bundled(backend=None): the test reads jobs of launch.BUNDLES, on ``backend`` (else the one its "
        "parameters name, else TensorFlow); conftest.py keeps each backend's such tests on one worker",
    )
    config.addinivalue_line(
        "markers",
        "by_backend: the file's tests form one group per backend their parameters name, not one for the "
        "whole file, so that two workers share a file of many costly jobs",
    )


def group_of(item: pytest.Item) -> str:
    """The pytest-xdist group ``item`` runs in: its backend's bundled jobs, its file and backend (marked
    ``by_backend``), or its file (the tests of a file share module fixtures and caches, as --dist
    loadfile would keep them)."""
    marker = item.get_closest_marker("bundled")
    params = item.callspec.params.values() if hasattr(item, "callspec") else ()
    if item.get_closest_marker("by_backend") is not None:
        return f"{item.path.name}-{next((v for v in params if v in BACKENDS), 'tensorflow')}"
    if marker is None or not bundles_enabled():
        return item.path.name
    backend = marker.args[0] if marker.args else next((v for v in params if v in BACKENDS), "tensorflow")
    return f"jobs-{backend}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The first test of a bundle starts the whole bundle: it gets the bundle's time.
    bundle_timeout = SECONDS_PER_BUNDLED_JOB * max(len(jobs) for jobs in BUNDLES.values()) + 120
    groups = {id(item): group_of(item) for item in items}
    for item in items:
        group = groups[id(item)]
        item.add_marker(pytest.mark.xdist_group(group))
        if group.startswith("jobs-"):
            item.add_marker(pytest.mark.timeout(bundle_timeout), append=False)
    # A stable sort: each group's tests keep their order.
    items.sort(key=lambda item: -GROUP_SECONDS.get(groups[id(item)], NEW_GROUP_SECONDS))


def pytest_collection_finish(session: pytest.Session) -> None:
    # pytest-xdist puts a test's group into its id; where it cannot (pytest-xdist 3.8 under pytest
    # 9.2), every worker runs the bundles its tests need: the same results, more CPU.
    # (Only an xdist worker of --dist loadgroup has the option.)
    grouped = getattr(session.config.option, "loadgroup", False)
    if grouped and any("@" not in item.nodeid for item in session.items):
        warnings.warn(
            "pytest-xdist's groups did not reach the test ids: each worker runs its own copy of the bundled "
            "jobs (pip install 'pytest<9.2' with pytest-xdist 3.8)",
            stacklevel=1,
        )


@pytest.fixture(scope="session")
def tf() -> ModuleType:
    """TensorFlow, for the tests that use it in pytest's own process. Imported here, by the first
    test that asks, and not at the top of their files: every xdist worker collects every file, and
    each would pay the import (3 CPU-s, 4 s of the session's start on 2 cores) for tests that only
    one of them runs."""
    import tensorflow

    return tensorflow


BACKENDS = ("tensorflow", "torch", "jax")


def skip_unless_installed(backend: str) -> None:
    """Skips the calling test, saying why, where ``backend``'s framework is missing (nox installs
    both: noxfile.py, TORCH)."""
    import importlib.util

    if importlib.util.find_spec(backend) is None:
        installs = {"torch": "pip install torch==2.13.0", "jax": "pip install 'jax[cpu]'"}
        install = installs.get(backend, f"pip install {backend}")
        pytest.skip(f"{backend} is not installed ({install}, or nox's keras session)")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The Keras backend a test's ranks run on (KERAS_BACKEND): the tests that take it run on each,
    skipping where its framework is missing."""
    skip_unless_installed(request.param)
    return request.param
