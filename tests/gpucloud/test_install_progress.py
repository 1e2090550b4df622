"""tools/install_progress.py: pip's few hundred lines become a few lines of progress in `make run`'s log."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys

from tests.gpucloud.test_up import ROOT

PIP_OUTPUT = "\n".join(
    [
        "Looking in links: /opt/wheels",
        *(f"Collecting pkg{i}==1.0 (from -r requirements.lock (line {i}))" for i in range(6)),
        "  Downloading pkg5-1.0-py3-none-any.whl (1.2 MB)",
        *(f"Processing /opt/wheels/local{i}-2.0-py3-none-any.whl (from -r requirements.lock)" for i in range(2)),
        "Installing collected packages: " + ", ".join(f"pkg{i}" for i in range(8)),
        "Successfully installed " + " ".join(f"pkg{i}-1.0" for i in range(8)),
        "",
    ]
)


def test_a_log_gets_a_line_per_quarter_the_install_and_the_total() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "install_progress.py"), "--total", "8"],
        input=PIP_OUTPUT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert [line.split(" packages")[0].strip() for line in lines[:4]] == [
        "collected 2/8",
        "collected 4/8",
        "collected 6/8",
        "collected 8/8",
    ]
    assert "(1 downloaded, 7 already on this machine) local1" in lines[3]
    assert lines[4].startswith("  installing 8 packages")
    assert lines[-1].startswith("  installed 8 packages in ")
    assert len(lines) == 6, lines
    assert "Collecting" not in result.stdout


def test_a_terminal_gets_one_line_kept_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("install_progress", ROOT / "tools" / "install_progress.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["install_progress"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    out = io.StringIO()
    progress = module.Progress(total=8, out=out, tty=True)
    for line in PIP_OUTPUT.splitlines():
        progress.read(line)
    progress.show()  # a tick after the end says nothing more
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.count("\r\033[K") == 11  # 8 packages, a download, the install, the total
    assert text.rstrip().rsplit("\r\033[K", 1)[-1].startswith("  installed 8 packages")
