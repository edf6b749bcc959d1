"""The installed libraries export tnt's API and nothing else.

A toolchain that links libstdc++ statically (common for compilers loaded as HPC modules) puts a
private copy of the C++ runtime into each library. Exported, that copy interposes the one every
other library of the process uses, and start-up crashed inside istream on such a node. The linker
version scripts in cmake/ keep it local; this test holds them to it on any toolchain.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tnt_comm

PACKAGE = Path(tnt_comm.__file__).parent
# Demangled names tnt's libraries may export: its namespace (with vtables and typeinfo), the C ABI
# and the Python module's init function. Linkers also mark a few ELF housekeeping symbols global.
ALLOWED = re.compile(
    r"^((typeinfo|typeinfo name|vtable|VTT) for )?tnt::|^tnt_comm_api$|^PyInit__core$|^_init$|^_fini$"
)
# A build with GPI-2 also exports the one GPI-2 function it replaces (test_gpi2_clock.py).
GPI2_BUILD = "gpi2" in tnt_comm.build_info()["transports"]
GPI2_REPLACED = "gaspi_get_cpufreq"


def exported(library: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed, so exported symbols cannot be listed")
    out = subprocess.run(
        [nm, "-D", "--defined-only", "-C", str(library)], capture_output=True, text=True, check=True
    ).stdout
    # Lines are "address type name"; the name may contain spaces.
    return [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]


def libraries() -> list[Path]:
    found = sorted(PACKAGE.glob("_core*.so")) + sorted((PACKAGE / "lib").glob("libtnt_comm.so.*.*.*"))
    assert len(found) == 2, f"expected the module and libtnt_comm under {PACKAGE}, found {found}"
    return found


@pytest.mark.parametrize("library", libraries(), ids=lambda p: p.name.split(".")[0])
def test_only_tnt_symbols_are_exported(library: Path) -> None:
    names = exported(library)
    assert names, f"{library.name} exports nothing at all"
    foreign = [n for n in names if not ALLOWED.search(n) and not (GPI2_BUILD and n == GPI2_REPLACED)]
    assert not foreign, f"{library.name} exports {len(foreign)} symbols outside tnt's API, e.g. {foreign[:10]}"


def test_the_c_abi_and_module_init_are_exported() -> None:
    module, core = libraries()
    assert "PyInit__core" in exported(module)
    names = exported(core)
    assert "tnt_comm_api" in names
    assert any(n.startswith("tnt::Runtime::init") for n in names), "the C++ API is not exported"
    assert (GPI2_REPLACED in names) == GPI2_BUILD, "gaspi_get_cpufreq must be exported where GPI-2 is built in"
