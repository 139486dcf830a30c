"""The data-aware placement part and policy, on plain ClusterViews."""

from __future__ import annotations

from types import MappingProxyType

from sluice.model import ClusterView, JobView, NodeView, Phase, Place
from sluice.policy.data_aware import DataAwarePolicy
from sluice.policy.parts.data_aware import local_share, order_by_storage_gap
from sluice.policy.registry import make_policy

GB = 10**9


def node(name: str, cached: dict[str, float] | None = None, free: int = 100 * GB, cpu: float = 8) -> NodeView:
    return NodeView(name, cpu=cpu, cached_datasets=MappingProxyType(cached or {}), cache_free_bytes=free)


def job(jid: str, datasets: dict[str, int], t: float = 0.0, cpu: float = 2.0) -> JobView:
    return JobView(
        id=jid,
        tenant="t",
        name=jid,
        phase=Phase.QUEUED,
        submitted_at=t,
        cpu_min=cpu,
        datasets=tuple(datasets),
        dataset_bytes=MappingProxyType(datasets),
    )


def view(nodes: list[NodeView], jobs: list[JobView]) -> ClusterView:
    return ClusterView(now=10.0, nodes={n.name: n for n in nodes}, jobs={j.id: j for j in jobs})


def test_local_share_weighs_datasets_by_bytes() -> None:
    n = node("a", {"big": 0.5, "small": 1.0})
    j = job("j", {"big": 9 * GB, "small": 1 * GB})
    assert abs(local_share(n, j) - (4.5 + 1.0) / 10) < 1e-9


def test_job_goes_to_the_node_holding_its_data() -> None:
    v = view([node("a"), node("b", {"imgs": 1.0}), node("c", {"imgs": 0.3})], [job("j", {"imgs": 5 * GB})])
    [d] = DataAwarePolicy().decide(v)
    assert isinstance(d, Place) and d.allocation.primary_node == "b"
    assert "100% of its data" in d.reason


def test_jobs_sharing_a_dataset_land_together_so_it_is_warmed_once() -> None:
    jobs = [job("j1", {"new": 5 * GB}, t=1), job("j2", {"other": 1 * GB}, t=2), job("j3", {"new": 5 * GB}, t=3)]
    v = view([node("a"), node("b")], jobs)
    placed = {d.job_id: d.allocation.primary_node for d in DataAwarePolicy().decide(v) if isinstance(d, Place)}
    assert placed["j1"] == placed["j3"]
    two = view([node("a", cpu=4), node("b", cpu=4)], [job("j1", {"new": 5 * GB}, t=1), job("j3", {"new": 5 * GB}, t=3)])
    spread = {d.job_id: d.allocation.primary_node for d in make_policy("kube").decide(two) if isinstance(d, Place)}
    assert spread["j1"] != spread["j3"]  # the baseline scatters them: two cold caches
    together = {d.job_id: d.allocation.primary_node for d in DataAwarePolicy().decide(two) if isinstance(d, Place)}
    assert together["j1"] == together["j3"]


def test_queue_is_sorted_by_smallest_storage_gap() -> None:
    v = view(
        [node("a", {"warm": 1.0})],
        [job("cold", {"x": 5 * GB}, t=1), job("warm", {"warm": 5 * GB}, t=2), job("none", {}, t=3)],
    )
    assert [j.id for j in order_by_storage_gap(v, list(v.jobs.values()))] == ["warm", "none", "cold"]


def test_node_without_room_for_the_rest_scores_lower() -> None:
    v = view([node("full", free=0), node("roomy", free=100 * GB)], [job("j", {"d": 50 * GB})])
    [d] = DataAwarePolicy().decide(v)
    assert isinstance(d, Place) and d.allocation.primary_node == "roomy"


def test_registered_under_its_name() -> None:
    assert make_policy("data-aware").name == "data-aware"
