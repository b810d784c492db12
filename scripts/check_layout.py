#!/usr/bin/env python3
"""The layout rules `make check` enforces (see ARCHITECTURE.md):

- no Rust file over 900 lines before its tests, no Python module over 900 lines;
- no function over 90 lines (Rust and Python);
- every Rust module and Python module of the tree is named in ARCHITECTURE.md;
- no module of python/mimi_py imports a name with a leading `_` from another module of the
  package (`from .common import _need`): a helper two modules share has a plain name, and a
  module's `__all__` says what users may use. Modules themselves may be private
  (`from . import _core`), and dunder names (`__version__`) are fine;
- no two Rust files of crates/mimi-core import each other, directly or in a loop
  (scripts/import_cycles.py).

`--report N` also lists the functions longer than N lines (default: none listed).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import import_cycles

ROOT = Path(__file__).resolve().parent.parent
MAX_FILE, MAX_FN = 900, 90
RUST_DIRS = ["crates/mimi-core/src", "src"]
PY_DIRS = ["python/mimi_py", "tests", "benches", "examples", "scripts"]
FN = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")


def rust_files() -> list[Path]:
    return sorted(p for d in RUST_DIRS for p in (ROOT / d).rglob("*.rs"))


def py_files() -> list[Path]:
    return sorted(p for d in PY_DIRS for p in (ROOT / d).rglob("*.py"))


def rust_body_lines(lines: list[str]) -> int:
    """Lines before the file's inline `#[cfg(test)]` module (all of a tests-only file). A
    declaration of a test module in another file (`mod tests;`) is not where the tests start."""
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]") or line.startswith("#[cfg(all(test"):
            nxt = (lines[i + 1] if i + 1 < len(lines) else "").rstrip()
            inline = not nxt.endswith(";")
            if inline and (nxt.startswith("mod ") or nxt.startswith("pub(crate) mod tests")):
                return i
    return len(lines)


def rust_functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each fn, by matching braces from its signature."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        depth, started = 0, False
        for j in range(i, len(lines)):
            code = lines[j].split("//")[0]
            depth += code.count("{") - code.count("}")
            started = started or "{" in code
            if started and depth <= 0:
                out.append((m.group(7), i + 1, j - i + 1))
                break
            if not started and code.rstrip().endswith(";"):
                break
    return out


def py_functions(path: Path) -> list[tuple[str, int, int]]:
    tree = ast.parse(path.read_text())
    return [
        (n.name, n.lineno, n.end_lineno - n.lineno + 1)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def module_names() -> list[str]:
    """The modules the map must name: Rust files and folders, Python modules."""
    names = set()
    for p in rust_files():
        rel = p.relative_to(ROOT)
        if p.name in ("mod.rs", "lib.rs", "main.rs") or "bin" in rel.parts:
            continue
        names.add(p.stem)
    for d in ["crates/mimi-core/src", "crates/mimi-core/src/codec"]:
        names.update(q.name for q in (ROOT / d).iterdir() if q.is_dir() and q.name != "bin")
    for p in (ROOT / "python/mimi_py").rglob("*.py"):
        if p.name not in ("__init__.py", "__main__.py"):
            names.add(p.stem)
    return sorted(names)


def _imported_from(path: Path, node: ast.ImportFrom) -> tuple[str, Path] | None:
    """The package module a `from ... import` reads (its dotted name, and where it would be a
    folder), or None when it is outside mimi_py."""
    pkg = ROOT / "python"
    if node.level:
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        parts = list(base.relative_to(pkg).parts) + (node.module or "").split(".")
    elif (node.module or "").split(".")[0] == "mimi_py":
        parts = (node.module or "").split(".")
    else:
        return None
    parts = [q for q in parts if q]
    return ".".join(parts), pkg.joinpath(*parts)


def private_imports() -> list[str]:
    """`from M import _name` in python/mimi_py, M one of its modules and `_name` not a module."""
    out = []
    for p in sorted((ROOT / "python/mimi_py").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            source = _imported_from(p, node) if isinstance(node, ast.ImportFrom) else None
            if source is None:
                continue
            module, folder = source
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if any((folder / f).exists() for f in (f"{name}.py", f"{name}.pyi", name)):
                    continue  # a private module (_core, _cuda), not a name
                out.append(f"{p.relative_to(ROOT)}:{node.lineno}: imports private `{name}` from {module}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", type=int, default=0, help="also list functions longer than this")
    args = ap.parse_args()
    problems, long = [], []
    for p in rust_files():
        lines = p.read_text().splitlines()
        if rust_body_lines(lines) > MAX_FILE:
            problems.append(f"{p.relative_to(ROOT)}: {rust_body_lines(lines)} lines before its tests")
        for name, line, n in rust_functions(p):
            long.append((n, f"{p.relative_to(ROOT)}:{line} {name}"))
    for p in py_files():
        if len(p.read_text().splitlines()) > MAX_FILE:
            problems.append(f"{p.relative_to(ROOT)}: over {MAX_FILE} lines")
        for name, line, n in py_functions(p):
            long.append((n, f"{p.relative_to(ROOT)}:{line} {name}"))
    problems += [f"{where}: {n} lines (at most {MAX_FN})" for n, where in long if n > MAX_FN]
    arch = (ROOT / "ARCHITECTURE.md").read_text()
    problems += [f"ARCHITECTURE.md does not name module `{m}`" for m in module_names() if m not in arch]
    problems += private_imports()
    problems += import_cycles.problems(ROOT)
    if args.report:
        for n, where in sorted(long, reverse=True):
            if n > args.report:
                print(f"{n:4d}  {where}")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"layout: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
