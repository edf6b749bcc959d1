#!/usr/bin/env python3
"""Holds tnt-comm's includes to the layer table of docs/design.md ("Inside tnt-comm").

The table's rows are the layers, from the top down; its second column lists each layer's files in
backticks: a source under src/ (`runtime.cpp`), a folder of src/ (`engine/`), a public header
(`tnt_comm/group.hpp`, under include/) or the Python module (`python/_core.cpp`). Every C++ file of
the package must sit in exactly one layer. The rules, each a line of the report when broken:

- a file includes only files of its own layer or of a layer below it;
- the layers the table marks "public headers only" (the bindings, the C ABI) include public
  headers alone, and so do the public headers themselves;
- no include leads in a circle between modules (a source and its header of the same name are one
  module: src/group.cpp with include/tnt_comm/group.hpp);
- every quoted include names a file of the package.

Usage: check_layers.py [DESIGN_MD] [PACKAGE_DIR]; exits 1 naming file, line and rule of each break.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE_SUFFIXES = (".cpp", ".hpp", ".h", ".cc")
PUBLIC_ONLY = "public headers only"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
_CELL = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Layer:
    name: str
    rank: int  # 0 is the top
    entries: tuple[str, ...]
    public_only: bool


@dataclass(frozen=True)
class Break:
    file: str
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}"


def read_table(design: Path) -> list[Layer]:
    """The layers of the first table under the heading "Inside tnt-comm" whose header row starts
    with "layer"."""
    text = design.read_text()
    section = text.split("## Inside tnt-comm", 1)
    if len(section) < 2:
        raise SystemExit(f"{design}: no section '## Inside tnt-comm', where the layer table belongs")
    layers: list[Layer] = []
    in_table = False
    for line in section[1].splitlines():
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if cells and cells[0] == "layer":
            in_table = True
            continue
        if in_table and not cells:
            break
        if in_table and cells and not set(cells[0]) <= set("-: "):
            what = cells[2] if len(cells) > 2 else ""
            layers.append(Layer(cells[0], len(layers), tuple(_CELL.findall(cells[1])), PUBLIC_ONLY in what))
    if not layers:
        raise SystemExit(f"{design}: no layer table (a header row starting 'layer') under '## Inside tnt-comm'")
    return layers


def package_files(package: Path) -> list[str]:
    """The package's C++ files, as the table names them: src/ paths bare, public headers as
    tnt_comm/..., the bindings as python/..."""
    found = [str(p.relative_to(package / "src")) for p in (package / "src").rglob("*") if p.suffix in SOURCE_SUFFIXES]
    found += [str(p.relative_to(package / "include")) for p in (package / "include").rglob("*")
              if p.suffix in SOURCE_SUFFIXES]
    found += [str(p.relative_to(package)) for p in (package / "python").glob("*") if p.suffix in SOURCE_SUFFIXES]
    return sorted(found)


def disk_path(package: Path, name: str) -> Path:
    if name.startswith("tnt_comm/"):
        return package / "include" / name
    if name.startswith("python/"):
        return package / name
    return package / "src" / name


def module_of(name: str) -> str:
    """A source and its header are one module: group.cpp and tnt_comm/group.hpp are 'group'."""
    stem = name.rsplit(".", 1)[0]
    return stem.removeprefix("tnt_comm/")


def check(design: Path, package: Path) -> list[Break]:
    layers = read_table(design)
    files = package_files(package)
    breaks: list[Break] = []
    layer_of: dict[str, Layer] = {}
    for name in files:
        owners = [
            layer for layer in layers
            if any(name == e or (e.endswith("/") and name.startswith(e)) for e in layer.entries)
        ]
        if len(owners) != 1:
            where = "no layer" if not owners else "several layers (" + ", ".join(o.name for o in owners) + ")"
            breaks.append(Break(str(disk_path(package, name).relative_to(package)), 1,
                                f"in {where} of {design.name}'s table: list it in exactly one"))
            continue
        layer_of[name] = owners[0]
    for layer in layers:
        for entry in layer.entries:
            if not any(name == entry or (entry.endswith("/") and name.startswith(entry)) for name in files):
                breaks.append(Break(design.name, 1, f"layer {layer.name!r} lists `{entry}`, which is no file here"))
    edges: dict[str, set[str]] = {}
    where_included: dict[tuple[str, str], tuple[str, int]] = {}
    for name in files:
        mine = layer_of.get(name)
        path = disk_path(package, name)
        shown = str(path.relative_to(package))
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = _INCLUDE.match(line)
            if not match:
                continue
            target = match[1]
            if target not in layer_of and target not in files:
                breaks.append(Break(shown, number, f'#include "{target}": no such file of tnt-comm'))
                continue
            a, b = module_of(name), module_of(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
                where_included.setdefault((a, b), (shown, number))
            theirs = layer_of.get(target)
            if mine is None or theirs is None:
                continue
            public = target.startswith("tnt_comm/")
            if (mine.public_only or name.startswith("tnt_comm/")) and not public:
                who = f"the {mine.name} layer" if mine.public_only else "a public header"
                breaks.append(Break(shown, number, f'#include "{target}": {who} includes public headers only'))
            elif theirs.rank < mine.rank:
                breaks.append(Break(shown, number, f'#include "{target}": the {mine.name} layer includes '
                                                   f"the {theirs.name} layer above it"))
    breaks += [Break(*where_included[(cycle[0], cycle[1])], "modules include each other in a circle: "
                     + " -> ".join(cycle)) for cycle in circles(edges)]
    return breaks


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The circles among modules: in each strongly connected set (Tarjan's algorithm), the shortest
    circle through each member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                # The shortest circle through each member, each circle once.
                seen: set[frozenset[str]] = set()
                for member in sorted(members):
                    circle = _path_around(member, set(members), edges)
                    if frozenset(circle) not in seen:
                        seen.add(frozenset(circle))
                        found.append(circle)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _path_around(start: str, inside: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest circle through ``start`` within ``inside``, ending where it began."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(n for n in edges.get(node, ()) if n in inside):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    return [start, start]  # not reached: a strongly connected set has a circle through each member


def main(argv: list[str]) -> int:
    design = Path(argv[0]) if argv else ROOT / "docs" / "design.md"
    package = Path(argv[1]) if len(argv) > 1 else ROOT / "packages" / "tnt-comm"
    breaks = check(design, package)
    for item in breaks:
        print(item)
    if breaks:
        print(f"{len(breaks)} break(s) of the layer table in {design}", file=sys.stderr)
        return 1
    print(f"tnt-comm's includes keep the layer table of {design}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
