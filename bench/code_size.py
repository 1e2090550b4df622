"""Module and function sizes of the product's code (tests, migrations and this bench left out).

    .venv/bin/python bench/code_size.py [--root DIR] [--top 10] [--json]

Prints the largest modules (lines), how many pass 400 lines, and the median
and 90th-percentile length of functions and methods (lines from `def` to the
last line of the body, decorators and docstrings included). `--root` measures
another checkout, e.g. a worktree of an older commit, to compare.
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
from pathlib import Path

PACKAGES = ("gpucloud", "common", "tenants", "inventory", "jobs", "frontend", "bench")
LIMIT = 400


def _modules(root: Path) -> list[Path]:
    found: list[Path] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "migrations" not in path.parts and "node_modules" not in path.parts:
                found.append(path)
    return found


def _function_lengths(tree: ast.AST) -> list[int]:
    return [
        (node.end_lineno or node.lineno) - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def measure(root: Path, top: int) -> dict[str, object]:
    """Return the figures for the checkout at `root`."""
    sizes: dict[str, int] = {}
    lengths: list[int] = []
    for path in _modules(root):
        text = path.read_text()
        sizes[str(path.relative_to(root))] = len(text.splitlines())
        lengths += _function_lengths(ast.parse(text))
    ordered = sorted(sizes.items(), key=lambda item: -item[1])
    deciles = statistics.quantiles(lengths, n=10)
    return {
        "modules": len(sizes),
        "largest": ordered[:top],
        "over_400_lines": [name for name, lines in ordered if lines > LIMIT],
        "functions": len(lengths),
        "function_lines_median": statistics.median(lengths),
        "function_lines_p90": deciles[8],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.root, args.top)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"{figures['modules']} modules, {figures['functions']} functions")
    print(f"function lines: median {figures['function_lines_median']}, p90 {figures['function_lines_p90']:.0f}")
    print(f"modules over {LIMIT} lines: {len(figures['over_400_lines'])}")  # type: ignore[arg-type]
    for name, lines in figures["largest"]:  # type: ignore[attr-defined]
        print(f"  {lines:5d}  {name}")


if __name__ == "__main__":
    main()
