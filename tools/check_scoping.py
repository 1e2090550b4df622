"""Scoping by construction: tenant-scoping bypasses only where tools/scoping_allowlist.toml says, with its reason.

    .venv/bin/python tools/check_scoping.py [--allowlist FILE] [PATH ...]

Reads every Python file under the given paths (default: the repository, but
tests/, the client package and what is not ours) with Python's `ast`, and
finds each use of a bypass:

- `all_tenants`: the named manager that reads and writes across tenants
  (but `X.all_tenants.none()`, which reads nothing);
- raw SQL: `connection.cursor` / `connections[...].cursor`, a `.raw(...)` or
  `.extra(...)` queryset call, `RawSQL`, and importing `common.sql`, the
  pieces the hand-written statements are built from.

A use is allowed when an entry of the allow-list covers its file (a
directory ending in `/`, a glob such as `*/migrations/*`, or a file),
optionally one function of it (`file.py:function` covers that function and
what it nests; `Class.method` for a method), for that kind of bypass. Every
other use is printed as `file:line: ...` and the exit status is 1; so is an
entry that covers no use any more, so the list never outgrows the code.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / "tools" / "scoping_allowlist.toml"
KINDS = ("all_tenants", "raw_sql")
# Not console code: the tests, the client package (no Django), vendored and generated trees.
SKIPPED = ("tests/", "client/", ".venv/", "node_modules/", "data/", "build/", ".git/")


@dataclass(frozen=True)
class Use:
    """One bypass in the code: where, which kind, what it is, and the function it sits in ('' at module level)."""

    path: str
    line: int
    kind: str
    what: str
    function: str


@dataclass(frozen=True)
class Entry:
    """One allow-list entry: the files (and function) it covers, for which kinds of bypass, and why."""

    target: str
    kinds: tuple[str, ...]
    reason: str

    @property
    def files(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def function(self) -> str:
        return self.target.split(":", 1)[1] if ":" in self.target else ""

    def covers(self, use: Use) -> bool:
        """Return whether this entry allows `use`."""
        if use.kind not in self.kinds or not _matches(self.files, use.path):
            return False
        return not self.function or use.function == self.function or use.function.startswith(f"{self.function}.")


def _matches(pattern: str, path: str) -> bool:
    if pattern.endswith("/"):
        return path.startswith(pattern)
    return fnmatch.fnmatchcase(path, pattern)


class _Finder(ast.NodeVisitor):
    """Collects the bypasses of one module, each with the qualified name of the function around it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.uses: list[Use] = []
        self._scope: list[str] = []
        self._harmless: set[int] = set()  # ids of `all_tenants` nodes that read nothing: `X.all_tenants.none()`

    def _add(self, node: ast.AST, kind: str, what: str) -> None:
        line = getattr(node, "lineno", 0)
        self.uses.append(Use(self.path, line, kind, what, ".".join(self._scope)))

    def _nested(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _nested

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "all_tenants" and id(node) not in self._harmless:
            self._add(node, "all_tenants", "all_tenants")
        elif node.attr == "cursor" and _is_connection(node.value):
            self._add(node, "raw_sql", "connection.cursor")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # `X.all_tenants.none()` names a model (for a schema, an empty answer) and reads no tenant's rows.
        harmless = _all_tenants_of_none(node)
        if harmless is not None:
            self._harmless.add(id(harmless))
        # `.raw(sql)` and `.extra(...)` on a queryset or manager; a call with no argument is something else.
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("raw", "extra") and (node.args or node.keywords):
            self._add(node, "raw_sql", f".{node.func.attr}()")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "RawSQL":
            self._add(node, "raw_sql", "RawSQL")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "common.sql" or (node.module == "common" and any(a.name == "sql" for a in node.names)):
            self._add(node, "raw_sql", "import of common.sql")
        if any(alias.name == "RawSQL" for alias in node.names):
            self._add(node, "raw_sql", "RawSQL")

    def visit_Import(self, node: ast.Import) -> None:
        if any(alias.name == "common.sql" for alias in node.names):
            self._add(node, "raw_sql", "import of common.sql")


def _all_tenants_of_none(node: ast.Call) -> ast.Attribute | None:
    """Return the `all_tenants` of a call `X.all_tenants.none()`, else None."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr != "none" or node.args or node.keywords:
        return None
    manager = func.value
    return manager if isinstance(manager, ast.Attribute) and manager.attr == "all_tenants" else None


def _is_connection(node: ast.expr) -> bool:
    if isinstance(node, ast.Subscript):
        node = node.value
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("connection", "connections")


def uses_in(path: Path, root: Path) -> list[Use]:
    """Return the bypasses in the Python file `path`, named relative to `root`."""
    finder = _Finder(path.relative_to(root).as_posix())
    finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return finder.uses


def python_files(paths: Iterable[Path], root: Path) -> Iterator[Path]:
    """Yield the Python files under `paths`, in order, leaving out SKIPPED."""
    for path in paths:
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in found:
            relative = file.relative_to(root).as_posix()
            if not any(relative.startswith(skip) or f"/{skip}" in relative for skip in SKIPPED):
                yield file


def load_allowlist(path: Path) -> list[Entry]:
    """Return the entries of the allow-list at `path`; raise ValueError for an entry without a reason or kind."""
    entries = []
    for raw in tomllib.loads(path.read_text(encoding="utf-8")).get("allow", []):
        kinds = tuple(raw.get("uses", ()))
        if not raw.get("path") or not raw.get("reason", "").strip() or not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"{path}: each entry needs a path, a reason and uses among {KINDS}: {raw}")
        entries.append(Entry(raw["path"], kinds, raw["reason"].strip()))
    return entries


def check(uses: list[Use], entries: list[Entry], *, allowlist: str = ALLOWLIST.name) -> list[str]:
    """Return a message for each use no entry covers, then one for each entry (of file `allowlist`) that covers
    no use."""
    problems = [
        f"{u.path}:{u.line}: {u.what} outside the allow-list ({u.kind}); read through the scoped managers, "
        f"or add an entry with its reason to tools/scoping_allowlist.toml"
        for u in uses
        if not any(entry.covers(u) for entry in entries)
    ]
    for entry in entries:
        for kind in entry.kinds:
            if not any(entry.covers(u) for u in uses if u.kind == kind):
                problems.append(f"{allowlist}: entry {entry.target!r} allows {kind} where there is none")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    parser.add_argument("--root", type=Path, default=ROOT, help="what paths are named relative to")
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    paths = [p.resolve() for p in args.paths] or [root]
    uses = [use for file in python_files(paths, root) for use in uses_in(file, root)]
    problems = check(uses, load_allowlist(args.allowlist), allowlist=args.allowlist.name)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} scoping problem(s); see tools/check_scoping.py", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
