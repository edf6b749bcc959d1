"""scripts/check_layers.py, which `nox -s lint` runs: it passes on tnt-comm as it is, and fails on a
tree that breaks each of its rules, naming the file, the line and the rule."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
DESIGN = PACKAGE.parents[1] / "docs" / "design.md"
_spec = importlib.util.spec_from_file_location("check_layers", PACKAGE / "scripts" / "check_layers.py")
assert _spec is not None and _spec.loader is not None
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers  # its dataclasses look their module up there
_spec.loader.exec_module(check_layers)


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tnt-comm"
    for part in ("src", "include", "python"):
        shutil.copytree(PACKAGE / part, tree / part, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return tree


def _add_include(path: Path, header: str) -> int:
    """Adds an include as the file's first line; the line it is on."""
    path.write_text(f'#include "{header}"\n' + path.read_text())
    return 1


def test_the_package_keeps_the_table() -> None:
    assert check_layers.check(DESIGN, PACKAGE) == []


def test_each_broken_rule_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    # Upward: a transport file includes the engine; a public header a private one; the bindings a
    # source of src/; two modules each other; a file the table does not list; an unknown include.
    _add_include(tree / "src" / "transport" / "link.cpp", "engine/engine.hpp")
    _add_include(tree / "include" / "tnt_comm" / "work.hpp", "job.hpp")
    _add_include(tree / "python" / "_core.cpp", "transport/fabric.hpp")
    _add_include(tree / "src" / "reduce" / "kernels.cpp", "fusion/planner_helpers.hpp")
    (tree / "src" / "orphan.cpp").write_text("int orphan();\n")
    _add_include(tree / "src" / "identity.cpp", "timeline_extra.hpp")
    (tree / "src" / "timeline_extra.hpp").write_text('#include "tnt_comm/identity.hpp"\n')
    found = {str(b) for b in check_layers.check(DESIGN, tree)}
    assert "src/transport/link.cpp:1: #include \"engine/engine.hpp\": the transport layer includes the engine " \
           "layer above it" in found, found
    assert "include/tnt_comm/work.hpp:1: #include \"job.hpp\": a public header includes public headers only" in found
    assert "python/_core.cpp:1: #include \"transport/fabric.hpp\": the bindings layer includes public headers " \
           "only" in found, found
    assert "src/reduce/kernels.cpp:1: #include \"fusion/planner_helpers.hpp\": no such file of tnt-comm" in found
    assert "src/orphan.cpp:1: in no layer of design.md's table: list it in exactly one" in found
    # timeline_extra.hpp is in no layer either; and identity -> timeline_extra -> identity is a circle.
    assert any(b.startswith("src/") and "modules include each other in a circle: " in b
               and "identity" in b and "timeline_extra" in b for b in found), found
    assert check_layers.main([str(DESIGN), str(tree)]) == 1


def test_a_table_entry_without_a_file_is_a_break(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    (tree / "src" / "job.cpp").unlink()
    found = {str(b) for b in check_layers.check(DESIGN, tree)}
    assert "design.md:1: layer 'runtime' lists `job.cpp`, which is no file here" in found, found
