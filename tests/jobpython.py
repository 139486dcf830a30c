"""An interpreter that a job running as a tenant uid can execute, for the tests.

With tenant isolation on (the tests run as root), a job's `python` runs as an unprivileged
uid. The test venv's interpreter usually cannot be run by such a uid: it lives under a private
home folder (here /root/.pyenv, /root being 0700). So, when that is the case, this builds a
small venv on an interpreter of the same minor version that every uid can run (Debian's
/usr/bin/python3.X), whose site-packages load this venv's (same ABI: same minor version), and
the tests point settings.job_python at it (SLUICE_JOB_PYTHON). This is the deployment rule of
docs/security.md, applied to the test machine; the agent's launch check is what says when it
is broken.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

from sluice.agent.isolation import interpreter_paths, unreachable
from sluice.model import JobUser

NOBODY = JobUser(2**31 - 3, 2**31 - 3)
"""A uid no file belongs to: what every tenant uid may reach, this one may."""


def reachable(paths: list[tuple[str, int]]) -> bool:
    return all(unreachable(p, NOBODY, want) is None for p, want in paths)


def _site_dirs() -> list[str]:
    return [d for d in site.getsitepackages() if os.path.isdir(d)]


def _candidates() -> list[str]:
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = [shutil.which(f"python{v}", path=p) for p in ("/usr/bin", "/usr/local/bin", "/opt/python/bin")]
    return [c for c in found if c and os.path.realpath(c) != os.path.realpath(sys.executable)]


def make_job_python() -> tuple[str | None, Path | None]:
    """(interpreter for SLUICE_JOB_PYTHON, folder to remove afterwards); (None, None) when the
    current one already serves every uid, or when nothing does (the launch check then says so)."""
    if reachable(interpreter_paths(sys.executable)):
        return None, None
    sdk = str(Path(__file__).resolve().parents[1] / "src" / "sluice" / "sdk")
    needed = [(d, os.R_OK | os.X_OK) for d in _site_dirs()]
    if os.path.isdir(sdk):
        needed.append((sdk, os.R_OK | os.X_OK))
    for base in _candidates():
        if not reachable([(base, os.X_OK), *needed]):
            continue
        root = Path(tempfile.mkdtemp(prefix="sluice-jobpython-"))
        root.chmod(0o755)
        venv = root / "venv"
        done = subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], capture_output=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            continue
        py = venv / "bin" / "python"
        lib = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # An import line in a .pth runs at start-up: addsitedir also reads the venv's own .pth
        # files (the editable install of sluice among them).
        lines = [f"import site; site.addsitedir({d!r})" for d in _site_dirs()]
        Path(lib, "sluice-test-venv.pth").write_text("\n".join(lines) + "\n")
        return str(py), root
    return None, None
