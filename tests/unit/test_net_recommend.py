"""The datapath recommendation is a pure function of measured numbers: each rule, with values."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from sluice.agent.launchenv import build_env, net_env
from sluice.model import Allocation, LaunchRequest
from sluice.net.recommend import Measured, NoCandidate, from_results, recommend
from sluice.settings import Settings
from sluice.spec import JobSpec

KB, MB = 1024, 1 << 20


def _m(name: str, small: float, large: float, cpu: float | None = 0.5, **kw: object) -> Measured:
    return Measured(name=name, allreduce_s={KB: small, 64 * MB: large}, cpu_s_per_gb=cpu, **kw)  # type: ignore[arg-type]


def test_bandwidth_and_latency_profiles_pick_by_their_own_message_size() -> None:
    """vxlan is fastest on large messages here, macvlan on small ones: each profile sees its own size."""
    ms = [_m("routed", 0.0004, 0.50), _m("vxlan", 0.0009, 0.30), _m("macvlan", 0.0002, 0.60)]
    bw = recommend(ms, "allreduce")
    lat = recommend(ms, "latency")
    assert bw.datapath == "vxlan" and bw.metric == "all-reduce time, 64 MiB"
    assert lat.datapath == "macvlan" and lat.metric == "all-reduce time, 1 KiB"
    assert bw.scores["routed"] == pytest.approx(500.0)  # milliseconds
    assert any("vxlan" in r and "best" in r for r in bw.reasons)


def test_a_tie_within_noise_goes_to_the_lower_cpu_cost() -> None:
    ms = [_m("routed", 0.001, 0.300, cpu=0.9), _m("bridge", 0.001, 0.310, cpu=0.4), _m("vxlan", 0.001, 0.5, cpu=0.1)]
    rec = recommend(ms, "allreduce", tolerance=0.05)
    assert rec.datapath == "bridge"  # 3 % slower than routed: a tie; cheaper per GB
    assert set(rec.tied) == {"routed", "bridge"}  # vxlan is 67 % slower: not in the tie despite its low CPU
    assert recommend(ms, "allreduce", tolerance=0.01).datapath == "routed"  # tighter noise: no tie


def test_a_tie_without_cpu_numbers_goes_to_the_simpler_datapath() -> None:
    ms = [_m("vxlan", 0.001, 0.3, cpu=None), _m("routed", 0.001, 0.3, cpu=None)]
    assert recommend(ms, "allreduce").datapath == "routed"


def test_noisy_best_widens_the_tie_but_only_up_to_a_cap() -> None:
    noisy = {KB: 0.001, 64 * MB: 0.3}
    ms = [
        Measured("routed", allreduce_s=noisy, allreduce_spread={64 * MB: 0.20}, cpu_s_per_gb=0.9),
        _m("bridge", 0.001, 0.35, cpu=0.2),  # 17 % slower: inside a 20 % spread
        _m("vxlan", 0.001, 0.45, cpu=0.1),  # 50 % slower: outside even the 25 % cap
    ]
    rec = recommend(ms, "allreduce")
    assert rec.datapath == "bridge" and "vxlan" not in rec.tied


def test_host_only_when_allowed_and_loopback_never() -> None:
    ms = [_m("host", 0.0001, 0.1), _m("loopback", 0.00001, 0.01, cross_node=False), _m("routed", 0.001, 0.3)]
    rec = recommend(ms, "allreduce")
    assert rec.datapath == "routed"
    assert "isolates no tenant" in rec.excluded["host"] and "reference" in rec.excluded["loopback"]
    assert recommend(ms, "allreduce", allow_host=True).datapath == "host"


def test_without_allreduce_numbers_tcp_and_latency_decide() -> None:
    ms = [
        Measured("routed", tcp_n_gbps=9.0, rr_p50_us=30.0),
        Measured("vxlan", tcp_n_gbps=4.0, rr_p50_us=20.0),
    ]
    assert recommend(ms, "allreduce").datapath == "routed"
    assert recommend(ms, "latency").datapath == "vxlan"


def test_data_profile_weighs_small_and_large_reads_equally() -> None:
    """Geometric mean: 40*160 beats 100*50 (80 vs 70.7), though the second has the better small-file rate."""
    ms = [
        Measured("routed", data_small_mbps=40.0, data_large_mbps=160.0),
        Measured("bridge", data_small_mbps=100.0, data_large_mbps=50.0),
    ]
    rec = recommend(ms, "data")
    assert rec.datapath == "routed" and rec.scores["routed"] == pytest.approx(80.0)


def test_nothing_usable_is_an_error_naming_why() -> None:
    with pytest.raises(NoCandidate, match="no datapath"):
        recommend([Measured("host", tcp_n_gbps=10.0), Measured("routed")], "allreduce")
    with pytest.raises(ValueError, match="profile"):
        recommend([], "throughput")  # type: ignore[arg-type]


def test_from_results_reads_bench_json_and_drops_a_wrong_allreduce() -> None:
    stats = {"median": 0.01, "min": 0.009, "max": 0.02, "p25": 0.0095, "p75": 0.0105, "n": 5}
    results = {
        "datapaths": {
            "routed": {
                "mtu": 1500,
                "cross_node": True,
                "tcp_n": {"gbps": {**stats, "median": 9.0}, "cpu_s_per_gb": {**stats, "median": 0.5}},
                "allreduce": {"exact": True, "sizes": [{"bytes": 1024, "time_s": stats}]},
                "data": {
                    "small": {"mb_per_s": {**stats, "median": 50}},
                    "large": {"mb_per_s": {**stats, "median": 200}},
                },
            },
            "vxlan": {"mtu": 1450, "allreduce": {"exact": False, "sizes": [{"bytes": 1024, "time_s": stats}]}},
            "ipip": {"skipped": "ipip: Error: Unknown device type."},
        }
    }
    ms = {m.name: m for m in from_results(results)}
    assert set(ms) == {"routed", "vxlan"}
    r = ms["routed"]
    assert r.tcp_n_gbps == 9.0 and r.cpu_s_per_gb == 0.5 and r.mtu == 1500
    assert r.allreduce_s == {1024: 0.01} and r.allreduce_spread[1024] == pytest.approx(0.1)
    assert r.data_small_mbps == 50 and r.data_large_mbps == 200
    assert ms["vxlan"].allreduce_s == {}, "an all-reduce that summed wrong is no measurement"
    assert recommend(list(ms.values()), "latency").datapath == "routed"


# ---------------------------------------------------------------------- applying it to jobs
def _req(env: dict[str, str] | None = None) -> LaunchRequest:
    spec = JobSpec(command=["python", "-c", "pass"], env=env or {})
    return LaunchRequest("j", 1, "t1", spec, Allocation.single("n0"), "/tmp/ck")


def test_net_interface_reaches_gloo_and_nccl_and_a_job_may_override(tmp_path: Path) -> None:
    assert net_env(None) == {}
    env = build_env(_req(), run_dir=tmp_path, node="n0", node_cpus=1, gpus=[], base={}, net_interface="eth1")
    assert env["GLOO_SOCKET_IFNAME"] == "eth1" and env["NCCL_SOCKET_IFNAME"] == "eth1"
    unset = build_env(_req(), run_dir=tmp_path, node="n0", node_cpus=1, gpus=[], base={})
    assert "GLOO_SOCKET_IFNAME" not in unset
    own = build_env(
        _req({"GLOO_SOCKET_IFNAME": "ib0"}), run_dir=tmp_path, node="n0", node_cpus=1, gpus=[], base={},
        net_interface="eth1",
    )  # fmt: skip
    assert own["GLOO_SOCKET_IFNAME"] == "ib0" and own["NCCL_SOCKET_IFNAME"] == "eth1"


@pytest.mark.parametrize("bad", ["", "eth 0", "a/b", "x" * 16, "eth0;rm"])
def test_net_interface_setting_refuses_what_is_not_an_interface_name(bad: str) -> None:
    with pytest.raises(ValidationError, match="net_interface"):
        Settings(net_interface=bad)
    assert Settings(net_interface="flannel.1").net_interface == "flannel.1"


def test_ray_nodes_not_bound_to_net_interface_are_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    """An existing cluster's nodes are started by the operator: the engine compares each node's
    Ray address with its agent's address for net_interface and says what to do, once a node."""
    from sluice.engine.ray import RayEngine
    from sluice.engine.ray_membership import RayNode

    engine = RayEngine.__new__(RayEngine)  # only the check; no cluster
    engine.net_interface, engine._net_warned = "eth1", set()
    bound = RayNode("id-a", "a", "10.0.0.5", 1.0)
    unbound = RayNode("id-b", "b", "192.168.1.7", 1.0)
    with caplog.at_level(logging.WARNING, logger="sluice.engine.ray"):
        engine._check_net(bound, "10.0.0.5")
        engine._check_net(unbound, "10.0.0.6")
        engine._check_net(unbound, "10.0.0.6")
        engine._check_net(RayNode("id-c", "c", "192.168.1.8", 1.0), "none")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "node b: Ray advertises 192.168.1.7, not 10.0.0.6 on net_interface eth1" in said[0]
    assert "ray start --node-ip-address=10.0.0.6" in said[0]
    assert "node c: net_interface eth1 has no usable IPv4 address" in said[1]


def test_a_ddp_rank_that_fails_after_its_last_step_keeps_the_step_time_and_is_flagged() -> None:
    from sluice.net.measure import describe_exit
    from sluice.net.report import COLUMNS, rows

    step = {"median": 0.0123, "min": 0.012, "max": 0.013, "n": 3}
    teardown = [{"repeat": 1, "exits": [describe_exit(-6), describe_exit(0)], "stderr": ["", ""]}]
    res = {"datapaths": {"lo": {"mtu": 65536, "ddp": {"step_s": step, "teardown_failed": teardown}},
                         "br": {"mtu": 1500, "ddp": {"error": "RuntimeError: ddp ranks failed"}}}}  # fmt: skip
    col = COLUMNS.index("DDP step (ms)")
    (lo, br) = rows(res)
    assert lo[col] == "12.3 ±0.5 !" and br[col] == "error"
    assert teardown[0]["exits"] == ["killed by SIGABRT", "exit 0"]


def test_a_loopback_port_is_free_and_below_the_ephemeral_range() -> None:
    """Ports the kernel hands to outgoing connections are never used for a loopback rendezvous:
    one of them can be taken between choosing it and binding it."""
    from sluice.net import measure
    from sluice.net.datapaths import Endpoints

    ep = Endpoints("loopback", None, "127.0.0.1", None, "127.0.0.1", "lo", 65536)
    ports = {measure._port(ep, measure.DIST_PORT) for _ in range(20)}
    assert len(ports) > 1 and all(measure.DIST_PORT <= p < measure._ephemeral_low() for p in ports)


def test_the_local_engine_refuses_an_interface_this_machine_does_not_have(tmp_path: Path) -> None:
    """Every node of the local engine is this machine: with a net_interface it lacks, every gang
    job's replicas crashed in gloo ("Unable to find address for: nonexist0") and were restarted
    the same way (walkthrough 4); `sluice up` now refuses, naming the setting and what is there."""
    from sluice.agent.netif import NetInterfaceUnavailable
    from sluice.engine.local import LocalEngine
    from sluice.settings import Settings

    with pytest.raises(NetInterfaceUnavailable, match="net_interface 'nonexist0': no such network interface"):
        LocalEngine(Settings(home=tmp_path / "home", net_interface="nonexist0"))
