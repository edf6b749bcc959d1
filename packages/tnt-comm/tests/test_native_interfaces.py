"""The installed C++ package (find_package) and the C ABI capsule."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

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


class Api(ctypes.Structure):
    DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("rank", ctypes.CFUNCTYPE(ctypes.c_int)),
        ("size", ctypes.CFUNCTYPE(ctypes.c_int)),
        (
            "allreduce_async",
            ctypes.CFUNCTYPE(
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_uint64,
                ctypes.c_int32,
                ctypes.c_int32,
                DONE,
                ctypes.c_void_p,
            ),
        ),
        (
            "broadcast_async",
            ctypes.CFUNCTYPE(
                ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int32, DONE, ctypes.c_void_p
            ),
        ),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p)),
    ]


def test_c_abi_capsule() -> None:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api = Api.from_address(get(tnt_comm._core._C_API, b"tnt_comm._C_API"))
    assert api.version == 1 and api.size() == tnt_comm.size() and api.rank() == tnt_comm.rank()
    results: list[bytes | None] = []
    done = Api.DONE(lambda ctx, err: results.append(err))
    x = np.arange(8, dtype=np.float32)
    y = np.empty_like(x)
    assert api.allreduce_async(x.ctypes.data, y.ctypes.data, 8, 2, 0, done, None) == 0
    tnt_comm.barrier()  # a blocking call drives queued work too
    assert results == [None] and np.array_equal(x, y)
    assert api.allreduce_async(x.ctypes.data, y.ctypes.data, 8, 99, 0, done, None) != 0
    assert b"dtype" in api.last_error()


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
