"""The TensorFlow op (tnt_keras.backends.tensorflow.ops) with real rank processes: results,
ordering, both backends, failures, the build cache.

TensorFlow takes seconds to import, so each job runs many checks per process: one 3-rank job builds
the op concurrently into an empty cache and ends with a dead peer; a 2-rank and a 1-rank job reuse
that cache. Each rank prints one RESULT line of JSON that the tests below read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from ranks import Result, run

SRC = Path(__file__).resolve().parents[1] / "src"
TIMEOUT_S = 20  # TNT_TIMEOUT_S of the jobs: a failing check ends its job in seconds, not minutes

RANK_CODE = r"""
import contextlib, io, json, logging, os, sys, tempfile, time, types

records = []


class Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))


logging.getLogger("tnt_keras").addHandler(Keep())
logging.getLogger("tnt_keras").setLevel(logging.INFO)
t_import = time.time()
# The op's package without the __init__ of the packages above it (Keras, the runtime, logging setup,
# the backend's other modules): faster, and the op is tested on its own terms.
folder = os.environ["TNT_KERAS_SRC"]
for name in ("tnt_keras", "tnt_keras.backends", "tnt_keras.backends.tensorflow"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(folder, *name.split("."))]
    sys.modules[name] = package
import numpy as np
import tensorflow as tf
import tnt_comm
import tnt_keras.backends.tensorflow.ops as o

out = {"import": [t_import, time.time()], "backend_at_import": o.backend(), "suites": []}
r, n = tnt_comm.rank(), tnt_comm.size()
DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8"]
OPS = ["sum", "prod", "min", "max", "avg"]
SHAPE = (3, 4)
TOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}


def value(k, shape=SHAPE):  # small integers 1..4: exact in every dtype, products fit in uint8
    base = np.arange(int(np.prod(shape))).reshape(shape)
    return (base * (k + 1) + k) % 4 + 1


def tensor(dtype, k=None, shape=SHAPE):
    return tf.cast(tf.constant(value(r if k is None else k, shape)), dtype)


def check(got, op, dtype, what, shape=SHAPE):
    got = got.numpy()
    assert got.shape == shape, (what, op, dtype, got.shape)
    assert got.dtype == tf.as_dtype(dtype).as_numpy_dtype, (what, op, dtype, got.dtype)
    v = np.stack([value(k, shape) for k in range(n)]).astype(np.int64)
    if op == "avg":
        want = v.sum(0) / n if "float" in dtype else v.sum(0) // n
    else:
        want = {"sum": v.sum(0), "prod": v.prod(0), "min": v.min(0), "max": v.max(0)}[op]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=TOL.get(dtype, 0), err_msg=f"{what} {op} {dtype}")


def expect(exc, fn, *texts):
    try:
        fn()
    except exc as e:
        assert all(t in str(e) for t in texts), (texts, str(e))
    else:
        raise AssertionError(f"no {exc.__name__}")


COMBOS = [(dt, op) for dt in DTYPES for op in OPS]


def suite():
    tag = o.backend()
    t0 = time.monotonic()
    for dt, op in COMBOS:
        check(o.allreduce(tensor(dt), op), op, dt, f"{tag} eager")

    @tf.function
    def many(xs):  # every start in a python loop, finished in reverse order
        ps = [o.start_allreduce(xs[dt], op) for dt, op in COMBOS]
        return [o.finish(p) for p in reversed(ps)][::-1]

    xs = {dt: tensor(dt) for dt in DTYPES}
    for _ in range(3):
        for (dt, op), got in zip(COMBOS, many(xs)):
            check(got, op, dt, f"{tag} tf.function")
    # Program order is what keeps ranks in step: each start runs after the one before it.
    ops = many.get_concrete_function(xs).graph.get_operations()
    starts = [op for op in ops if op.type in ("TntAllreduceStart", "PyFunc")]
    assert len(starts) == len(COMBOS), [op.type for op in ops]
    for a, b in zip(starts, starts[1:]):
        assert a in b.control_inputs, (a.name, b.name, [c.name for c in b.control_inputs])

    @tf.function
    def mixed(big, small):  # different sizes complete at different times; finish in a shuffled order
        ps = [o.start_allreduce(big * (i + 1) if i % 2 else small, "sum") for i in range(8)]
        return [o.finish(ps[i]) for i in (5, 0, 7, 2, 1, 6, 3, 4)]

    big = tf.fill([1 << 18], tf.cast(r + 1, tf.float32))
    total = n * (n + 1) / 2
    for _ in range(10):
        got = mixed(big, tensor("float32"))
        for j, i in enumerate((5, 0, 7, 2, 1, 6, 3, 4)):
            if i % 2:
                assert np.all(got[j].numpy() == total * (i + 1)), (tag, i)
            else:
                check(got[j], "sum", "float32", f"{tag} mixed")

    # Eager starts finished out of order, large, empty, scalar and 3-d tensors.
    p1 = o.start_allreduce(tensor("int32"), "max")
    p2 = o.start_allreduce(tf.fill([1 << 20], tf.cast(r + 1, tf.float32)))
    assert np.all(o.finish(p2).numpy() == total)
    check(o.finish(p1), "max", "int32", f"{tag} out of order")
    e = o.allreduce(tf.zeros((0, 3)))
    assert e.shape == (0, 3) and e.dtype == tf.float32
    assert o.allreduce(tf.constant(r, tf.int64), "max").numpy() == n - 1
    s = o.allreduce(tf.constant(1, tf.bfloat16))
    assert s.shape == () and float(s.numpy()) == n
    t = o.allreduce(tf.ones((2, 3, 4), tf.float64), "avg")
    assert t.shape == (2, 3, 4) and np.all(t.numpy() == 1.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def dynamic(x):
        return o.allreduce(x)

    assert dynamic(tf.ones((5, 2))).shape == (5, 2) and dynamic(tf.zeros((0, 2))).shape == (0, 2)
    assert np.all(dynamic(tf.ones((5, 2))).numpy() == n)

    # Fused sums: a list of tensors in one collective, each times this rank's weight (powers of two:
    # exact in every dtype). The last rank's weight is 0, so its NaN tensor must contribute zeros.
    weights = [2.0 ** -(k + 1) for k in range(n - 1)] + [0.0]
    shapes = [SHAPE, (), (0, 3), (37,), (5, 1, 3)]

    @tf.function
    def fused(xs, w):
        sums = o.finish_fused(o.start_fused_sum(xs, w))
        return [x * 1 for x in sums]  # the views feed ordinary kernels

    for dt in ("float16", "bfloat16", "float32", "float64"):
        xs = [tensor(dt, shape=sh) for sh in shapes]
        if r == n - 1:
            xs[0] = tf.fill(SHAPE, tf.constant(float("nan"), dt))
            xs[3] = tf.fill((37,), tf.constant(float("inf"), dt))
        eager = o.finish_fused(o.start_fused_sum(xs, weights[r]))
        for how, got in (("eager", eager), ("function", fused(xs, weights[r]))):
            for x, sh in zip(got, shapes):
                want = sum(w * value(k, sh).astype(np.float64) for k, w in enumerate(weights))
                assert x.shape == sh and x.dtype == tf.as_dtype(dt), (tag, how, dt, x.shape, x.dtype)
                assert np.array_equal(tf.cast(x, tf.float64).numpy(), want), (tag, how, dt, sh, x.numpy(), want)
    for dt in ("int32", "int64", "uint8"):  # unscaled: a plain fused sum
        got = o.finish_fused(o.start_fused_sum([tensor(dt), tensor(dt, shape=(7,))]))
        check(got[0], "sum", dt, f"{tag} fused")
        check(got[1], "sum", dt, f"{tag} fused", shape=(7,))
    expect(TypeError, lambda: o.start_fused_sum([tf.ones(2), tf.ones(2, tf.float64)]), "one dtype")
    expect(TypeError, lambda: o.start_fused_sum([tf.ones(2, tf.int32)], 0.5), "floating-point")
    expect(ValueError, lambda: o.start_fused_sum([]), "at least one")
    pf = o.start_fused_sum([tf.ones(2)])
    o.finish_fused(pf)
    expect(RuntimeError, lambda: o.finish_fused(pf), "already finished")

    # Bad input: clear errors, raised before anything reaches another rank.
    for bad in (tf.int8, tf.bool, tf.complex64, tf.uint16):
        expect(TypeError, lambda: o.allreduce(tf.zeros(2, bad)), bad.name, "float32", "uint8")
    expect(ValueError, lambda: o.allreduce(tf.zeros(2), "median"), "median", "avg")
    p = o.start_allreduce(tf.ones(3))
    o.finish(p)
    expect(RuntimeError, lambda: o.finish(p), "already finished")
    expect(TypeError, lambda: o.finish(tf.ones(3)), "Pending")
    out["suites"].append(tag)
    out[tag + "_s"] = round(time.monotonic() - t0, 2)


def compile_count():
    return sum("compiled the TensorFlow op" in m for _, m in records)


if os.environ["FIRST"] == "numpy":
    assert o.backend() == "numpy_function", o.backend()
    suite()
    o._select("auto")
    assert o.backend() == "async-op"
    suite()
else:
    assert o.backend() == "async-op", records
    suite()
    o._select("numpy")
    suite()
    o._select("auto")
out["compiled"] = compile_count()
# The one notice that a compile starts is expected; any other warning is a failure.
out["warnings"] = [m for lvl, m in records if lvl == "WARNING" and "compiling the TensorFlow op" not in m]
from tnt_keras.backends.tensorflow.ops import _build

out["library"] = str(_build.library_path(_build.compiler()))

if os.environ.get("BUILD_FAILURES") == "1":  # no compiler, a failing compiler: one warning, fallback
    from tnt_keras.backends.tensorflow.ops.__main__ import main

    loaded, env = o._loaded, dict(os.environ)
    os.environ["TNT_KERAS_CACHE_DIR"] = tempfile.mkdtemp()
    for cxx, text in (("/nonexistent/c++", "not an executable"), ("false", "exited with 1")):
        os.environ["CXX"] = cxx
        o._loaded = None
        before = len(records)
        o._select("auto")
        assert o.backend() == "numpy_function"
        new = [(lvl, m) for lvl, m in records[before:] if "compiling the TensorFlow op" not in m]
        assert len(new) == 1 and new[0][0] == "WARNING" and text in new[0][1], new
        expect(_build.BuildError, lambda: o._select("async-op"), text)
        check(o.allreduce(tensor("float32")), "sum", "float32", "after failed build")
    os.environ.clear()
    os.environ.update(env)
    o._loaded = loaded
    o._select("auto")
    assert o.backend() == "async-op"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main() == 0
    out["main_printed"] = buf.getvalue().strip()
    out["compiled"] = compile_count()

if os.environ.get("DEAD_PEER") == "1":  # the last rank dies; the others get errors, not a hang
    o.allreduce(tf.ones(4))
    if r == n - 1:
        print("RESULT " + json.dumps(out), flush=True)
        time.sleep(1.0)  # the others are past that allreduce by then
        os._exit(0)

    @tf.function
    def step(x):
        return o.allreduce(x) * 2

    dead = {}
    x = tf.ones([1 << 16])
    for what, fn in (("function", lambda: step(x)), ("again", lambda: step(x)), ("eager", lambda: o.allreduce(x))):
        t = time.monotonic()
        try:
            fn()
            dead[what] = "no error"
        except tf.errors.OpError as e:
            dead[what] = [type(e).__name__, round(time.monotonic() - t, 2), e.message[-800:]]
    o._select("numpy")
    try:
        o.allreduce(x)
        dead["numpy"] = "no error"
    except Exception as e:
        dead["numpy"] = [type(e).__name__, 0, str(e)[-800:]]
    out["dead"] = dead
    print("RESULT " + json.dumps(out), flush=True)
    # tnt_comm 0.1.0 bug: once a peer has failed, an asynchronous operation leaves its progress thread
    # spinning in Engine::drive (fail_all(); continue; never returns without a target), so the
    # atexit finalize() hangs. Skip it until that is fixed.
    os._exit(0)

print("RESULT " + json.dumps(out), flush=True)
"""


def outputs(results: list[Result]) -> list[dict[str, Any]]:
    parsed = []
    for res in results:
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {res.rank} printed no RESULT:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
        parsed.append(json.loads(lines[-1][len("RESULT ") :]))
    return parsed


def env(cache: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {
        "PYTHONPATH": path,
        "TNT_KERAS_CACHE_DIR": str(cache),
        "TNT_TIMEOUT_S": str(TIMEOUT_S),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TNT_KERAS_SRC": str(SRC),
        "TNT_KERAS_OPS": "",
        "TNT_LOG_LEVEL": "INFO",
        "TNT_LOG_ON_ALL_DEVICES": "1",
        "FIRST": "op",
        **extra,
    }


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tnt_keras_cache")


@pytest.fixture(scope="session")
def job3(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], list[Result]]:
    """3 ranks import at once into the empty cache, run every check, then rank 2 dies."""
    assert not any(cache.iterdir())
    # A guard against a hang, not a measure: the job compiles the op (cold, where no compiler cache has it)
    # and traces TensorFlow functions on 3 ranks of 2 shared cores, which took over 100 s beside other jobs.
    results = run(3, RANK_CODE, tmp_path_factory.mktemp("job3"), env=env(cache, DEAD_PEER="1"), timeout=200)
    return outputs(results), results


@pytest.fixture(scope="session")
def job2(job3: Any, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """2 ranks that reuse the cache, starting on the fallback that TNT_KERAS_OPS=numpy forces.

    One inter-op thread: finishing in reverse order must still not deadlock.
    """
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    extra = {"TNT_KERAS_OPS": "numpy", "FIRST": "numpy", "TF_NUM_INTEROP_THREADS": "1"}
    results = run(2, RANK_CODE, tmp_path_factory.mktemp("job2"), env=env(cache, **extra))
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    return outputs(results)


@pytest.mark.timeout(240)  # the first to ask for job3: its setup runs the job
def test_three_ranks_build_once_concurrently(job3: Any, cache: Path) -> None:
    outs, results = job3
    assert sum(o["compiled"] for o in outs) == 1, [r.stderr[-2000:] for r in results]
    builder = next(o for o in outs if o["compiled"])
    # The others were importing while it compiled, so they waited on the lock rather than arriving late.
    for o in outs:
        assert o["import"][0] < builder["import"][1], outs
    libs = sorted(p.name for p in cache.iterdir() if p.suffix == ".so")
    assert len(libs) == 1 and not [p for p in cache.iterdir() if p.suffix in (".tmp", ".o", ".failed")]
    assert all(o["library"] and Path(o["library"]).name == libs[0] for o in outs)


@pytest.mark.timeout(120)
def test_three_ranks_results(job3: Any) -> None:
    outs, _ = job3
    for o in outs:
        assert o["backend_at_import"] == "async-op"
        assert o["suites"] == ["async-op", "numpy_function"]
        assert not o["warnings"], o["warnings"]


@pytest.mark.timeout(120)
def test_dead_peer_fails_instead_of_hanging(job3: Any) -> None:
    outs, _ = job3
    for o in outs[:2]:
        dead = o["dead"]
        for what in ("function", "again", "eager", "numpy"):
            assert dead[what] != "no error", dead
            name, seconds, message = dead[what]
            assert seconds < TIMEOUT_S - 5, dead  # a closed link, well before the stall timeout
            assert "rank 2" in message, dead
        assert "tnt_comm allreduce" in dead["function"][2]


@pytest.mark.timeout(150)
def test_two_ranks_forced_fallback_then_op_from_cache(job2: list[dict[str, Any]]) -> None:
    for o in job2:
        assert o["backend_at_import"] == "numpy_function"
        assert o["suites"] == ["numpy_function", "async-op"]
        assert o["compiled"] == 0 and not o["warnings"]


@pytest.mark.timeout(150)
def test_one_rank_cache_reuse_and_build_failures(job3: Any, cache: Path, tmp_path: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    (o,) = outputs(run(1, RANK_CODE, tmp_path, env=env(cache, BUILD_FAILURES="1")))
    assert o["suites"] == ["async-op", "numpy_function"]
    assert o["compiled"] == 0, "the second import must load the cached library"
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    assert o["main_printed"] == o["library"]


QUIET_IMPORT_CODE = r"""
import json
import tnt_keras
from tnt_keras.backends.tensorflow import ops
print("RESULT " + json.dumps({"backend": ops.backend()}), flush=True)
"""


@pytest.mark.timeout(120)
def test_two_ranks_compile_at_default_log_level_without_deadlock(tmp_path: Path) -> None:
    """At the default log level only the compiling rank logs. Its log line must not start the
    runtime: that would wait in the rendezvous for the other rank, which waits for the compiler's
    file lock (a deadlock until TNT_TIMEOUT_S, seen in CI as a hung job with no output)."""
    cache = tmp_path / "cache"
    extra = {"TNT_LOG_LEVEL": "WARNING", "TNT_LOG_ON_ALL_DEVICES": "1"}
    outs = outputs(run(2, QUIET_IMPORT_CODE, tmp_path, env=env(cache, **extra), timeout=100))
    # Before the fix the job hung; with a rendezvous timeout shorter than the compile, the waiting
    # rank fell back to tf.numpy_function instead.
    assert [o["backend"] for o in outs] == ["async-op", "async-op"], outs
