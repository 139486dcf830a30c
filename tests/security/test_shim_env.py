"""The shim runs as the plane's user (root under isolation), outside every fence, and starts the
tenant's job: nothing of what the tenant chose may make it run the tenant's code. Attacked with
real jobs under a tenant uid: the spec's env (PYTHONPATH, LD_PRELOAD) and its workdir (a `python
-m` puts the current folder first on sys.path) each named a folder of the tenant's files, and
the root shim imported them (red team s22)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobExited, JobUser, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import kill_runs, remove_cgroups
from tests.isolating import needs_root

pytestmark = needs_root

MALLORY = JobUser(231_311, 231_311)

PLANT = "import os\nopen({out!r}, 'a').write(f'uid={{os.getuid()}}\\n')\n"


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    s = Settings(home=tmp_path / "home", cgroup_root=root)
    s.home.mkdir(mode=0o711)
    yield s
    kill_runs(s.runs_dir)
    remove_cgroups(root)


def _tenant_dir(tmp_path: Path, out: Path) -> Path:
    """A folder of the tenant's (as an earlier job of its would leave in /tmp), holding modules
    that record which uid imported them."""
    evil = tmp_path / "evil"
    (evil / "sluice").mkdir(parents=True)
    code = PLANT.format(out=str(out))
    for rel in ("sitecustomize.py", "argparse.py", "sluice/__init__.py"):
        (evil / rel).write_text(code)
    for p in (tmp_path, evil, evil / "sluice"):
        os.chown(p, MALLORY.uid, MALLORY.gid)
        p.chmod(0o755)
    for p in evil.rglob("*.py"):
        os.chown(p, MALLORY.uid, MALLORY.gid)
    out.touch(mode=0o666)
    out.chmod(0o666)
    return evil


def _run(settings: Settings, spec: JobSpec) -> JobExited:
    agent = NodeAgent("n0", settings.runs_dir, settings=settings)
    try:
        agent.launch(LaunchRequest("j", 1, "t", spec, Allocation.single("n0"), "", run_as=MALLORY))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for e in agent.poll():
                if isinstance(e, JobExited) and e.job_id == "j":
                    return e
            time.sleep(0.05)
        pytest.fail("the job did not end")
    finally:
        agent.close()


@pytest.mark.parametrize("how", ["PYTHONPATH", "workdir"])
def test_the_root_shim_runs_none_of_the_tenant_s_code(settings: Settings, tmp_path: Path, how: str) -> None:
    out = tmp_path / "imported-by"
    evil = _tenant_dir(tmp_path, out)
    script = "print('job ran')"
    spec = (
        JobSpec(command=["python", "-c", script], env={"PYTHONPATH": str(evil)})
        if how == "PYTHONPATH"
        else JobSpec(command=["python", "-I", "-c", script], workdir=str(evil))
    )
    _run(settings, spec)
    seen = out.read_text().split()
    assert "uid=0" not in seen, f"the shim (root) imported the tenant's code: {seen}"
