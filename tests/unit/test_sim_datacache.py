"""Node dataset caches in the simulator: LRU of whole datasets, reported as NodeCache events,
and the data placement study (`sluice bench data` scenario 6) run through the one simulator."""

from __future__ import annotations

import pytest

from sluice.control.simulate import DataCluster, SimConfig, WorkloadJob, data_workload, run_simulation
from sluice.model import Allocation, LaunchRequest, NodeCache, NodeInfo
from sluice.sim.datacache import GB, DataJob
from sluice.sim.engine import SimEngine
from sluice.spec import JobSpec


def test_lru_keeps_datasets_in_use_and_evicts_the_least_recently_used() -> None:
    c = DataCluster({"a": 40 * GB, "b": 40 * GB, "c": 40 * GB}, cache_bytes=100 * GB)
    assert c.start_reading("n0", "a") == (False, True)
    assert c.start_reading("n0", "b") == (False, True)
    c.stop_reading("n0", "a")
    c.stop_reading("n0", "b")  # b used last: a goes first
    assert c.start_reading("n0", "c") == (False, True)
    assert set(c.held("n0")) == {"b", "c"}
    assert c.start_reading("n0", "b") == (True, True)
    # b and c are being read: a has no room and evicts neither
    assert c.start_reading("n0", "a") == (False, False)
    assert set(c.held("n0")) == {"b", "c"} and c.free_bytes("n0") == 20 * GB


def test_a_job_on_a_warm_node_is_faster_and_reads_locally() -> None:
    c = DataCluster({"a": 100 * GB}, remote_bps=1 * GB, local_bps=10 * GB)
    cold = DataJob(c, "a", epochs=2, epoch_s=10.0)
    cold.place(Allocation.single("n0", 1.0))
    assert cold.advance(10_000.0, 1.0) == pytest.approx(100.0 + 10.0)  # first epoch remote-bound, then cached
    assert cold.local_bytes == pytest.approx(100 * GB) and cold.read_bytes == pytest.approx(200 * GB)
    warm = DataJob(c, "a", epochs=2, epoch_s=10.0)
    warm.place(Allocation.single("n0", 1.0))
    assert warm.advance(10_000.0, 1.0) == pytest.approx(20.0)
    assert warm.local_bytes == pytest.approx(200 * GB)


def test_the_engine_reports_caches_as_a_node_agent_does() -> None:
    c = DataCluster({"a": 10 * GB}, cache_bytes=50 * GB)
    engine = SimEngine([NodeInfo("n0", 16.0, 0), NodeInfo("n1", 16.0, 0)], data=c)
    first = [e for e in engine.poll() if isinstance(e, NodeCache)]
    assert {e.node for e in first} == {"n0", "n1"} and all(e.free_bytes == 50 * GB for e in first)
    engine.add_job("j", DataJob(c, "a", epochs=1, epoch_s=5.0))
    engine.launch(LaunchRequest("j", 1, "t", JobSpec(command=["x"]), Allocation.single("n1", 2.0), "/ckpt"))
    after = [e for e in engine.poll() if isinstance(e, NodeCache)]
    assert [(e.node, e.datasets, e.free_bytes) for e in after] == [("n1", {"a": 1.0}, 40 * GB)]


def test_data_aware_placement_reads_more_locally_than_binpack_through_the_controller() -> None:
    jobs, sizes = data_workload(150, n_datasets=40, seed=0)
    res = {}
    for policy in ("binpack", "data-aware"):
        cfg = SimConfig(nodes=8, gpus_per_node=0, cpus_per_node=16.0, interval_s=10.0, data=DataCluster(sizes))
        res[policy] = run_simulation(jobs, policy, cfg)
        assert len(res[policy].finished) == 150
    hit_b, hit_d = res["binpack"].local_read_share, res["data-aware"].local_read_share
    assert hit_b is not None and hit_d is not None and hit_d > hit_b


def test_a_data_job_needs_its_dataset_in_the_cluster() -> None:
    job = WorkloadJob("x", 0.0, "data", gpus=0, dataset="nope", epochs=1, epoch_s=1.0, cpus=1.0)
    with pytest.raises(ValueError, match="nope"):
        run_simulation([job], "binpack", SimConfig(nodes=1, gpus_per_node=0, data=DataCluster({"a": GB})))
