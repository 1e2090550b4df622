"""The core stays pure: it imports only an allowlist of standard modules and itself (no clock, no randomness).

import-linter (pyproject) forbids Django, the drivers and the other apps but
cannot see standard-library modules, so this test reads the core's imports
from its syntax tree and compares them with an allowlist.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jobs.scheduler.core

CORE = Path(jobs.scheduler.core.__file__).parent
ALLOWED = {"__future__", "bisect", "collections", "dataclasses", "enum", "heapq", "math", "typing"}


def imported_modules(source: str) -> set[str]:
    """Return the top-level names of every module `source` imports, relative imports as "."."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else node.module or ".")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names.add("__import__")
    return names


def forbidden(names: set[str]) -> set[str]:
    """Return the imports that are neither allowlisted standard modules nor the core itself."""
    return {n for n in names if n.split(".")[0] not in ALLOWED and not n.startswith("jobs.scheduler.core")}


def test_the_core_imports_only_the_allowlist() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5
    found = {str(path.relative_to(CORE)): forbidden(imported_modules(path.read_text())) for path in files}
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_the_check_catches_a_clock_randomness_and_django() -> None:
    source = (
        "import time\nfrom random import choice\nfrom datetime import datetime\nimport django.db\nfrom . import x\n"
    )
    assert forbidden(imported_modules(source)) == {"time", "random", "datetime", "django.db", "."}
