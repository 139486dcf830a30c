"""A live CPU cut resizes a real torch job's thread pool (the SDK follows its cgroup quota).

One real job under the node agent's real cgroup limit: it starts at 2 cores, is cut to 1
core live, then the limit is lifted; the thread count torch reports follows each change, up
to the count the job started with.
The count is asserted, not the speed (docs/benchmarks.md has the speed).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.agent.cgroup import CgroupKind
from sluice.agent.node_agent import NodeAgent
from sluice.model import Allocation, JobProgress, LaunchRequest
from sluice.settings import Settings
from sluice.spec import JobSpec
from tests.integration.conftest import JOBS, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.serial]


@pytest.fixture
def agent(sluice_settings: Settings) -> Iterator[NodeAgent]:
    a = NodeAgent("n0", sluice_settings.runs_dir, settings=sluice_settings)
    yield a
    a.close()


def test_a_live_cpu_cut_resizes_the_jobs_torch_thread_pool(agent: NodeAgent, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if agent.layout.kind is CgroupKind.AFFINITY:
        pytest.skip(f"no writable cgroup cpu controller here ({agent.layout.reason})")
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("needs two cores to see a cut from 2 threads to 1")
    spec = JobSpec(
        command=["python", str(JOBS / "threads_follow.py")],
        workdir=str(tmp_path),
        env={"SLUICE_THREADS_CHECK_S": "0.1"},
    )
    agent.launch(LaunchRequest("thr", 1, "t1", spec, Allocation.single("n0", 2.0, 2.0), str(tmp_path / "ckpt")))
    seen: list[JobProgress] = []

    def threads_now(n: int) -> bool:
        seen.extend(e for e in agent.poll() if isinstance(e, JobProgress) and e.job_id == "thr")
        return bool(seen) and seen[-1].metrics.get("threads") == n

    def log() -> str:
        p = Path(agent.log_path("thr"))
        return p.read_text()[-2000:] if p.exists() else "(no log)"

    assert wait_for(lambda: threads_now(2), timeout=60), f"never at 2 threads under a 2-core quota:\n{log()}"
    agent.resize("thr", 1, Allocation.single("n0", 1.0, 1.0))  # live: same process, new quota
    assert wait_for(lambda: threads_now(1), timeout=30), f"still {seen[-1].metrics} after a cut to 1 core"
    agent.resize("thr", 1, Allocation.single("n0", 1.0, None))  # limit lifted: the node's cores
    # ... but never more threads than the job started with (2, set at launch: the SDK's ceiling,
    # sdk/_threads.py): on 2 cores that is the node's cores too; on 16 (an H100 machine), 2.
    back = min(cores, 2)
    assert wait_for(lambda: threads_now(back), timeout=30), seen[-1].metrics
    agent.stop("thr", 1, checkpoint=False)
