"""Import cycles between the Rust files of crates/mimi-core (a rule of scripts/check_layout.py).

A file imports another when its code (tests excluded) names an item defined there: through
`use` trees or `crate::`/`super::`/`self::` paths. A name re-exported by a `pub use` resolves
to the file that defines it, so a folder's `mod.rs` that only declares and re-exports is
never part of a cycle. Calling a method defined in another file's `impl` needs no import and
is not counted.
"""

from __future__ import annotations

import re
from pathlib import Path

Module = tuple[str, ...]
USE = re.compile(r"\buse\s+([^;]+);")
PUB_USE = re.compile(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);")
PATH = re.compile(r"\b((?:crate|super)(?:::\w+)+)")


def module_of(root: Path, p: Path) -> Module | None:
    parts = p.relative_to(root).with_suffix("").parts
    if parts[0] == "bin" or p.name == "tests.rs" or "tests" in parts[:-1]:
        return None
    return parts[:-1] if parts[-1] in ("mod", "lib") else parts


def code_of(p: Path) -> str:
    """The file's code before an inline test module, comments removed."""
    lines = p.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("#[cfg(test)]") and not nxt.rstrip().endswith(";"):
            break
        out.append(re.sub(r"//.*", "", line))
    return "\n".join(out)


def expand(tree: str) -> list[str]:
    """`a::{b, c::{d, e as f}}` -> `a::b`, `a::c::d`, `a::c::e`."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    i = tree.find("{")
    if i < 0:
        return [tree]
    head, inner = tree[:i], tree[i + 1 : -1]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += (ch == "{") - (ch == "}")
        cur += ch
    parts.append(cur)
    return [x for part in parts if part for x in expand(head + part)]


def resolve(cur: Module, path: str, files: dict) -> Module | None:
    segs = [s for s in path.split("::") if s not in ("*", "")]
    if not segs:
        return None
    if segs[0] == "crate":
        return tuple(segs[1:])
    if segs[0] in ("super", "self"):
        base = cur
        while segs and segs[0] in ("super", "self"):
            base = base[:-1] if segs.pop(0) == "super" else base
        return base + tuple(segs)
    return cur + tuple(segs) if cur + (segs[0],) in files else None


def defining_file(full: Module, files: dict, reexports: dict) -> Module | None:
    for _ in range(8):
        if reexports.get(full, full) == full:
            break
        full = reexports[full]
    return next((full[:k] for k in range(len(full), -1, -1) if full[:k] in files), None)


def graph(root: Path) -> dict[Module, set[Module]]:
    files = {m: code_of(p) for p in sorted(root.rglob("*.rs")) if (m := module_of(root, p)) is not None}
    reexports = {}
    for m, code in files.items():
        for tree in PUB_USE.findall(code):
            for path in expand(tree):
                if (full := resolve(m, path, files)) and full[-1] != "self":
                    reexports[m + (full[-1],)] = full
    edges: dict[Module, set[Module]] = {m: set() for m in files}
    for m, code in files.items():
        paths = [p for tree in USE.findall(code) for p in expand(tree)] + PATH.findall(code)
        for path in paths:
            full = resolve(m, path, files)
            target = defining_file(full, files, reexports) if full is not None else None
            if target not in (None, m, ()):
                edges[m].add(target)
    return edges


def cycles(root: Path) -> list[list[Module]]:
    """The strongly connected groups of more than one file (Tarjan)."""
    edges, index, low, stack, on, out = graph(root), {}, {}, [], set(), []

    def visit(v: Module) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                out.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def problems(root: Path) -> list[str]:
    return [
        "crates/mimi-core: files that import each other: " + ", ".join("::".join(m) or "lib" for m in group)
        for group in cycles(root / "crates/mimi-core/src")
    ]
