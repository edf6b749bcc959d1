"""The installed C++ package (find_package) and the C ABI capsule."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import c_abi
import numpy as np
import pytest
import tnt_comm
from ranks import GPI2

CONSUMER_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
find_package(tnt_comm REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE tnt_comm::tnt_comm)
"""

CONSUMER_MAIN = """
#include <cstdio>
#include <vector>
#include <tnt_comm/tnt_comm.hpp>
int main() {
  tnt::Runtime& rt = tnt::Runtime::init();
  std::vector<float> x(10, 2.0f), y(10);
  rt.world().allreduce(x.data(), y.data(), x.size(), tnt::DType::float32, tnt::ReduceOp::sum);
  std::printf("size=%d y=%g\\n", rt.size(), y[9]);
  tnt::Runtime::finalize();
  return y[9] == 2.0f ? 0 : 1;
}
"""


@pytest.mark.timeout(300)
def test_find_package_from_cmake(tmp_path: Path) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    (tmp_path / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (tmp_path / "main.cpp").write_text(CONSUMER_MAIN)
    build = tmp_path / "build"
    subprocess.run(
        [cmake, "-S", str(tmp_path), "-B", str(build), f"-DCMAKE_PREFIX_PATH={tnt_comm.cmake_prefix_path()}"],
        check=True,
        capture_output=True,
    )
    subprocess.run([cmake, "--build", str(build)], check=True, capture_output=True)
    out = subprocess.run([str(build / "consumer")], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "size=1 y=2" in out.stdout, out.stderr


def test_c_abi_capsule() -> None:
    api = c_abi.table()
    assert api.version == 3 and api.size() == tnt_comm.size() and api.rank() == tnt_comm.rank()
    results, done = c_abi.recorder()
    x = np.arange(8, dtype=np.float32)
    y = np.empty_like(x)
    # The world, as 0 and as its id; a group, by its id.
    pair = tnt_comm.new_group([0])
    for group in (0, tnt_comm.world().id, pair.id):
        y[:] = -1
        assert api.allreduce_async(group, x.ctypes.data, y.ctypes.data, 8, 2, 0, done, None) == 0
        tnt_comm.barrier()  # a blocking call drives queued work too
        assert results.pop() is None and np.array_equal(x, y)
    # Refused starts: the error as data, kind first.
    assert api.allreduce_async(0, x.ctypes.data, y.ctypes.data, 8, 99, 0, done, None) != 0
    error = api.last_error().contents.data()
    assert error["kind"] == "InvalidArgument" and "dtype" in error["message"], error
    assert error["ranks"] == [] and error["operation"] == "" and error["call"] == -1, error
    assert api.broadcast_async(12345, x.ctypes.data, 8, 2, 0, done, None) != 0
    error = api.last_error().contents.data()
    assert error["kind"] == "InvalidArgument" and "no group with id 12345" in error["message"], error
    assert results == []
    # A single rank has no shared arena: no block, and freeing none is fine.
    block = ctypes.c_void_p(1)
    assert api.alloc_shared(1 << 20, ctypes.byref(block)) == 0 and block.value is None
    api.free_shared(None)
    # Tensor fusion: the layout (64-byte aligned offsets), then copy, scale and sum in one call.
    counts = (ctypes.c_uint64 * 2)(3, 20)
    offsets = (ctypes.c_uint64 * 2)()
    assert api.fused_layout(2, counts, 2, offsets) == 48 and list(offsets) == [0, 16]
    a, b = np.array([1, 2, 3], np.float32), np.full(20, 4, np.float32)
    flat = np.full(48, 7, np.float32)  # whatever was there: the padding becomes 0
    sources = (ctypes.c_void_p * 2)(a.ctypes.data, b.ctypes.data)
    half = ctypes.c_float(0.5)
    assert api.fused_allreduce_async(0, 2, sources, counts, flat.ctypes.data, 2, 0, ctypes.byref(half), done, None) == 0
    tnt_comm.barrier()
    assert results.pop() is None
    want = np.zeros(48, np.float32)
    want[:3], want[16:36] = a * 0.5, b * 0.5
    assert np.array_equal(flat, want), flat
    assert api.fused_allreduce_async(0, 1, sources, counts, flat.ctypes.data, 4, 0, ctypes.byref(half), done, None) != 0
    assert "floating-point" in api.last_error().contents.data()["message"]  # int32 takes no scale


def test_build_info_says_what_this_build_has() -> None:
    # In a fresh process: build_info must not start a runtime (it needs no job).
    code = (
        "import json, tnt_comm\n"
        "info = tnt_comm.build_info()\n"
        "print(json.dumps(info))\n"
        "assert not tnt_comm._core.is_initialized()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    if info["gpi2"] is None:
        assert info["transports"] == ["shm", "tcp"] and not GPI2
    else:
        assert info["transports"] == ["shm", "tcp", "gpi2"]
        assert re.fullmatch(r"\d+\.\d+\.\d+", info["gpi2"]["version"]), info["gpi2"]
        assert Path(info["gpi2"]["prefix"], "include", "GASPI.h").is_file(), info["gpi2"]
        assert info["gpi2"]["network"] in ("ethernet", "infiniband", "roce", "ofi"), info["gpi2"]
    assert info["version"] == tnt_comm.__version__
    assert Path(info["path"], "__init__.py").is_file()
    assert info["compiler"].split()[0] in ("GCC", "clang") and info["cxx_standard"] >= 201703
