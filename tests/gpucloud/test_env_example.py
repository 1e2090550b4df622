"""compose/.env.example documents every variable the code reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READERS = re.compile(r"""(?:env_\w+|os\.environ\.get|environ\.get|getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']""")


def _read_variables() -> set[str]:
    names: set[str] = set()
    for path in [*ROOT.glob("gpucloud/*.py"), *ROOT.glob("*/services/*.py")]:
        names |= set(READERS.findall(path.read_text()))
    return names


def _documented() -> dict[str, str]:
    lines = (ROOT / "compose/.env.example").read_text().splitlines()
    documented: dict[str, str] = {}
    for index, line in enumerate(lines):
        match = re.match(r"^#?\s*([A-Z][A-Z0-9_]+)=", line)
        if match:
            comment = lines[index - 1] if index else ""
            documented[match.group(1)] = comment
    return documented


def test_every_variable_is_in_env_example_with_a_comment() -> None:
    read = _read_variables()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS"} <= read, "the scan found the settings"
    documented = _documented()
    missing = sorted(read - set(documented))
    assert not missing, f"variables missing from compose/.env.example: {missing}"
    uncommented = sorted(name for name in read if not documented[name].startswith("#"))
    assert not uncommented, f"variables without a one-line meaning above them: {uncommented}"
