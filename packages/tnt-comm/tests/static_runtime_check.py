"""Exits non-zero unless the installed tnt_comm libraries link libstdc++ statically (nox comm_static)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import tnt_comm


def needed(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def main() -> int:
    if shutil.which("readelf") is None:
        print("readelf (binutils) is missing: cannot check how libstdc++ is linked")
        return 1
    package = Path(tnt_comm.__file__).parent
    libraries = sorted(package.glob("_core*.so")) + sorted((package / "lib").glob("libtnt_comm.so.*.*.*"))
    dynamic = [lib.name for lib in libraries if any(n.startswith("libstdc++") for n in needed(lib))]
    if not libraries or dynamic:
        print(f"expected a static libstdc++ in {[lib.name for lib in libraries]}; linked dynamically: {dynamic}")
        return 1
    print(f"libstdc++ is linked statically into {', '.join(lib.name for lib in libraries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
