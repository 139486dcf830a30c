"""A job that mounts a dataset gets it through the node cache, and the cache state reaches
the policy's ClusterView (data-aware placement sees where the data is)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import JobRecord, Phase
from sluice.settings import Settings
from sluice.spec import DatasetSpec, SpecError, parse_job_spec
from tests.isolating import needs_root

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def test_job_reads_its_dataset_and_the_cache_state_reaches_the_view(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(20):
        (src / f"item-{i:03d}.bin").write_bytes(bytes([i]) * (1000 + i))
    # isolation=off: the shared node cache, reported under `owner/name`, is what is checked
    # here; under isolation a job fills a cache of its uid's own, reported under that uid's key
    # (the isolation test below).
    settings = Settings(
        home=tmp_path / "home",
        policy="data-aware",
        reconcile_interval_s=0.1,
        dataset_roots=[str(tmp_path)],
        isolation="off",
    )
    plane = ControlPlane.from_settings(settings)
    tokens = plane.bootstrap_tenants()
    app = create_app(plane)  # before the job: /metrics counts the cache reads it reports
    plane.start()
    try:
        caller = plane.store.get_tenant("default")
        with pytest.raises(SpecError) as err:  # mounting an unregistered dataset is refused
            plane.submit(caller, parse_job_spec({"command": ["python", "x.py"], "datasets": [{"name": "nope"}]}))
        assert err.value.problems[0].field == "datasets"
        plane.datasets.create(caller, DatasetSpec(name="blobs", source=str(src)))
        job = _run_reader(plane, caller, sum(1000 + i for i in range(20)))
        tracker_bytes = [e for e in plane.why(caller, job.id) if e.kind == "phase"]
        assert tracker_bytes, "the job's history is recorded"
        # the agent reports the node's cache within its report interval
        deadline = time.monotonic() + 30
        cached: dict[str, float] = {}
        while time.monotonic() < deadline:
            cached = {k: v for n in plane.controller.view().nodes.values() for k, v in n.cached_datasets.items()}
            if cached.get("default/blobs", 0) >= 0.99:
                break
            time.sleep(0.5)
        assert cached.get("default/blobs", 0) >= 0.99  # the cache is per tenant: owner/name
        # ... and `sluice dataset list` shows it per node (the API's cached_on)
        node = plane.engine.nodes()[0].name
        with TestClient(app) as http:
            listed = http.get("/v1/datasets", headers={"Authorization": f"Bearer {tokens['default']}"})
            metrics = http.get("/metrics", headers={"Authorization": f"Bearer {tokens['admin']}"}).text
        assert listed.status_code == 200, listed.text
        [row] = listed.json()["items"]
        assert row["cached_on"][node] >= 0.99
        # ... and /metrics counts the job's 20 first reads as misses, and the bytes now cached
        assert 'sluice_dataset_cache_misses_total{dataset="default/blobs"} 20.0' in metrics
        held = re.findall(r'sluice_dataset_cached_bytes\{dataset="default/blobs",tier="\w+"\} (\S+)', metrics)
        assert held and float(max(held, key=float)) == sum(1000 + i for i in range(20))
        # warming goes through the local engine's agent, into the same cache the job filled
        [report] = plane.datasets.warm(caller, "blobs")
        assert report.node == plane.engine.nodes()[0].name and report.error is None
        assert (report.files_fetched, report.already_cached, report.cached_fraction) == (0, 20, 1.0)
        with pytest.raises(SpecError) as err:
            plane.datasets.warm(caller, "blobs", nodes=["elsewhere"])
        assert err.value.problems[0].field == "nodes"
    finally:
        plane.stop()


def _write_items(src: Path, extra: int) -> int:
    """20 items whose sizes depend on `extra`; their total size."""
    src.mkdir(exist_ok=True)
    for i in range(20):
        (src / f"item-{i:03d}.bin").write_bytes(bytes([i]) * (1000 + extra + i))
    return sum(1000 + extra + i for i in range(20))


def _run_reader(plane: ControlPlane, caller: Any, expect: int) -> JobRecord:
    """Run the job that reads dataset `blobs` (expecting `expect` bytes) to success."""
    spec = parse_job_spec(
        {
            "command": ["python", str(JOBS / "reads_dataset.py")],
            "env": {"DATASET": "blobs", "EXPECT_BYTES": str(expect)},
            "datasets": [{"name": "blobs"}],
            "resources": {"cpu": 0.5},
        }
    )
    job = plane.submit(caller, spec)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not plane.get_job(caller, job.id).phase.terminal:
        time.sleep(0.2)
    done = plane.get_job(caller, job.id)
    assert done.phase == Phase.SUCCEEDED, done.reason
    return done


@needs_root
def test_under_isolation_warm_fills_what_the_job_reads_and_rm_purges_it(tmp_path: Path) -> None:
    """The tenant's jobs run as its uid and read a cache of that uid's own: `warm` (through the
    local engine's agent) fills that one, `get` reports it, the job hits it; `rm` empties it and
    a dataset registered again under the name reads its new bytes, not the old ones."""
    src = tmp_path / "src"
    first = _write_items(src, 0)
    settings = Settings(home=tmp_path / "home", reconcile_interval_s=0.1, dataset_roots=[str(tmp_path)], isolation="on")
    plane = ControlPlane.from_settings(settings)
    tokens = plane.bootstrap_tenants()
    app = create_app(plane)
    plane.start()
    auth = {"Authorization": f"Bearer {tokens['default']}"}
    try:
        caller = plane.store.get_tenant("default")
        uid = plane.job_user("default").uid
        node = plane.engine.nodes()[0].name
        plane.datasets.create(caller, DatasetSpec(name="blobs", source=str(src)))
        [report] = plane.datasets.warm(caller, "blobs")
        assert report.error is None, report.error
        assert (report.node, report.files_fetched, report.cached_fraction) == (node, 20, 1.0)
        mine = [
            Path(settings.cache.resolved_disk_dir()) / f"uid-{uid}",
            Path(settings.cache.resolved_memory_dir()) / f"uid-{uid}",
        ]
        assert any(d.glob("default~blobs-*/item-000.bin") for d in mine)  # the tenant's own folders
        with TestClient(app) as http:
            assert http.get("/v1/datasets/blobs", headers=auth).json()["cached_fraction"] == 1.0
            # the node's agent reports the tenant's own copy (read as its uid, on its next
            # rounds): CACHED ON NODES and data-aware placement see what the job will find
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                cached_on = http.get("/v1/datasets/blobs", headers=auth).json()["cached_on"]
                if cached_on:
                    break
                time.sleep(0.5)
            assert cached_on == {node: 1.0}
            _run_reader(plane, caller, first)
            got = http.get("/v1/datasets/blobs", headers=auth).json()
            assert (sum(got["cache_hits"].values()), got["cache_misses"]) == (20, 0)  # warm was where it reads
            gone = http.delete("/v1/datasets/blobs", headers=auth)
            assert gone.status_code == 200 and gone.json()["nodes"] == {node: "removed"}, gone.text
            assert not [p for d in mine for p in d.glob("default~blobs-*")]
            second = _write_items(src, 500)  # same name, same source folder, new bytes
            plane.datasets.create(caller, DatasetSpec(name="blobs", source=str(src)))
            assert http.get("/v1/datasets/blobs", headers=auth).json()["cached_fraction"] == 0.0
            _run_reader(plane, caller, second)  # the job checks it read the new sizes
            got = http.get("/v1/datasets/blobs", headers=auth).json()
            assert got["cache_misses"] == 20
    finally:
        plane.stop()
