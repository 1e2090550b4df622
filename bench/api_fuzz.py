"""The API fuzz, long form: every operation of the OpenAPI schema as each role, and what it found.

    .venv/bin/python bench/api_fuzz.py [--examples 100] [--out fuzz.json]

Runs `tests/api/test_fuzz.py` (schemathesis over the published schema, real
objects of a tenant in the path; see its docstring for the checks) with
`--examples` generated requests per operation and role instead of the test
command's short default, on the embedded settings (SQLite). Prints the
requests made per role, the failing (operation, role) pairs and the kinds
of finding (schemathesis's check codes), as a table and as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Findings:
    """A pytest plugin that keeps each failing test's check codes."""

    def __init__(self) -> None:
        self.failed: dict[str, list[str]] = {}
        self.passed = 0

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call":
            return
        if report.passed:
            self.passed += 1
        elif report.failed:
            codes = sorted(set(re.findall(r"- (ST\d+ [^\n]+)", str(report.longrepr)))) or ["error"]
            self.failed[report.nodeid.split("[", 1)[-1].rstrip("]")] = codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100, help="generated requests per operation and role")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    os.environ["FUZZ_EXAMPLES"] = str(args.examples)
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import pytest

    findings = Findings()
    began = time.monotonic()
    pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "tests/api/test_fuzz.py"], plugins=[findings])
    from tests.api import test_fuzz

    kinds = Counter(code for codes in findings.failed.values() for code in codes)
    result = {
        "examples_per_operation_and_role": args.examples,
        "seconds": round(time.monotonic() - began, 1),
        "requests_per_role": dict(test_fuzz.REQUESTS),
        "operation_role_pairs": {"passed": findings.passed, "failed": len(findings.failed)},
        "findings_by_kind": dict(kinds),
        "failing": findings.failed,
    }
    print(f"\n{'role':<10} {'requests':>9}", file=sys.stderr)
    for role in test_fuzz.ROLES:
        print(f"{role:<10} {test_fuzz.REQUESTS[role]:>9}", file=sys.stderr)
    print(f"findings: {len(findings.failed)} failing (operation, role) pairs {dict(kinds)}", file=sys.stderr)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if findings.failed else 0


if __name__ == "__main__":
    sys.exit(main())
