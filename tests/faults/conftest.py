"""The fault suite's parts live in bench/_faults (bench/faults.py runs the long form); make them importable.

Appended, not prepended: the bench scripts beside the package must never shadow a module of the same name.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.append(str(BENCH))
