"""What a process-runtime workload can reach when the tests run as root: it runs as another user then.

A root agent runs each process-runtime workload as its unprivileged user
(`inventory.drivers.process._launch.workload_user`). Such a user cannot run
an interpreter kept under a private home (pyenv under /root), nor pass
through pytest's private temporary directories (0700) to a volume or a
workload directory. Tests that run Python workloads there use
`workload_python()`, and those whose workloads use absolute paths keep
their files in a `reachable_dir()` (the `workload_tmp` fixture, which
holds the test's volumes too); neither loosens anything the runtime itself
decides.
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path


def _passable(path: Path) -> bool:
    """Whether every directory from / down to `path` lets others through (their x bit)."""
    return all(os.stat(part).st_mode & stat.S_IXOTH for part in [path, *path.parents])


def workload_python() -> list[str]:
    """Return a command prefix that runs this Python, with this environment's packages, as a workload's user.

    This interpreter itself when its user may run it (not root, or an
    interpreter others can reach); otherwise the system's interpreter of the
    same version with this environment's site-packages on its path.
    """
    if os.geteuid() != 0 or _passable(Path(sys.executable).resolve().parent):
        return [sys.executable]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = Path(f"/usr/bin/python{version}")
    assert system.exists(), f"tests as root need {system}: a Python {version} that unprivileged users can run"
    # Jupyter finds its data files (JupyterLab's pages) and its extensions' configuration through these when
    # sys.prefix is not this environment.
    path, prefix = sysconfig.get_paths()["purelib"], Path(sys.prefix)
    jupyter = [f"JUPYTER_PATH={prefix / 'share' / 'jupyter'}", f"JUPYTER_CONFIG_PATH={prefix / 'etc' / 'jupyter'}"]
    return ["env", f"PYTHONPATH={path}", *jupyter, str(system)]


def reachable_dir() -> Path:
    """Return a new empty directory that others may pass through (0711), below the system's temporary directory.

    Not below pytest's own temporary directories: every pytest session that
    starts on this host makes those private again (0700), whatever a test
    running meanwhile had opened.
    """
    made = Path(tempfile.mkdtemp(prefix="gpucloud-workload-"))
    made.chmod(0o711)
    return made
