"""The network lab on this machine's kernel: real namespaces, links, iperf3 and gloo.

Needs root (network namespaces); skipped with the reason otherwise. Every test checks that
what it built is gone afterwards: nothing named after its run id is left in `ip netns`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sluice.net import measure
from sluice.net.datapaths import DATAPATHS, availability
from sluice.net.detect import FEATURES, _probe_link, detect
from sluice.net.ipcmd import list_netns, privilege_problem, run_ip, tool
from sluice.net.lab import Lab, clean

pytestmark = [pytest.mark.integration, pytest.mark.serial]

PROBLEM = privilege_problem()
needs_root = pytest.mark.skipif(PROBLEM is not None, reason=f"network lab: {PROBLEM}")
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def support() -> dict[str, object]:
    if PROBLEM is not None:
        pytest.skip(f"network lab: {PROBLEM}")
    with Lab() as lab:
        return dict(detect(lab))


@pytest.fixture
def lab() -> Iterator[Lab]:
    if PROBLEM is not None:
        pytest.skip(f"network lab: {PROBLEM}")
    with Lab() as lab_:
        yield lab_
    assert lab_.leftovers() == [], "the lab left namespaces behind"


def _buildable(support: dict[str, object]) -> list[str]:
    return [n for n, why in availability(support).items() if why is None and n != "loopback"]


# ---------------------------------------------------------------------- detection
@needs_root
def test_detection_reports_every_feature_and_the_kernels_refusal(support: dict[str, object]) -> None:
    assert set(support) == set(FEATURES)
    assert support["veth"].ok  # type: ignore[attr-defined]  # nothing of the lab works without it
    for name, s in support.items():
        assert s.reason, f"{name}: no reason given"  # type: ignore[attr-defined]
    avail = availability(support)
    for d in DATAPATHS.values():
        missing = [f for f in d.needs if not support[f].ok]  # type: ignore[attr-defined]
        if missing:
            assert avail[d.name] is not None and missing[0] in avail[d.name]  # type: ignore[operator]
    assert not [ns for ns in list_netns() if ns.startswith("sluice-") and ns.endswith("-probe")]


@needs_root
def test_a_link_kind_the_kernel_lacks_is_reported_not_raised(lab: Lab) -> None:
    ns = lab.add_netns("nope")
    s = _probe_link(ns, "sluice-made-up", ["type", "sluicemadeup"])
    assert not s.ok and s.reason.strip(), s  # the kernel's own words (here "Unknown device type")


@needs_root
def test_bench_records_a_missing_datapath_instead_of_failing(support: dict[str, object]) -> None:
    from sluice.net.bench import BenchConfig, run_bench

    missing = [n for n, why in availability(support).items() if why is not None]
    if not missing:
        pytest.skip("this kernel has every datapath the lab knows")
    cfg = BenchConfig(
        datapaths=[missing[0], "loopback"], skip={"tcp", "allreduce", "ddp", "data"}, rr_count=20, repeats=1
    )
    res = run_bench(cfg)
    assert "skipped" in res["datapaths"][missing[0]]
    assert set(res["unavailable"]) == {missing[0]}  # not every datapath this kernel lacks
    assert res["datapaths"]["loopback"]["latency"]["p50_us"]["n"] == 1
    assert not [ns for ns in list_netns() if ns.startswith(f"sluice-{res['run_id']}-")]


# ---------------------------------------------------------------------- setup / teardown
@needs_root
def test_each_datapath_carries_traffic_with_its_mtu_and_is_removed(lab: Lab, support: dict[str, object]) -> None:
    for name in _buildable(support):
        before = len(lab.namespaces)
        build = DATAPATHS[name].build
        assert build is not None
        ep = build(lab, 1500)
        assert all(ns.startswith(f"sluice-{lab.run_id}-") for ns in lab.namespaces)
        assert measure.mtu_of(ep) == (1450 if name == "vxlan" else 1500)
        rr = measure.latency(lab, ep, count=20, size=64, repeats=1)
        assert rr["p50_us"]["median"] > 0, name
        lab.teardown_from(before)
        assert lab.leftovers() == [], name
    # the host namespace never saw our links
    assert "sl-" not in run_ip("-o", "link", "show")


@needs_root
def test_an_exception_inside_the_lab_still_tears_it_down() -> None:
    with pytest.raises(RuntimeError, match="boom"), Lab() as lab:
        DATAPATHS["bridge"].build(lab, 1500)  # type: ignore[misc]
        assert len(lab.leftovers()) == 4
        raise RuntimeError("boom")
    assert lab.leftovers() == []


# The first line gives the lab the Ctrl-C a terminal user has: a job started in the background
# by a non-interactive shell (how CI runners often start `make test`) inherits SIGINT ignored,
# and Python then never raises KeyboardInterrupt.
LAB_SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from sluice.net.lab import Lab
from sluice.net.datapaths import DATAPATHS
with Lab(sys.argv[1]) as lab:
    ep = DATAPATHS["routed"].build(lab, 1500)
    lab.spawn(ep.server_ns, ["sleep", "300"])
    print("ready", flush=True)
    time.sleep(120)
"""


def _start_lab_process(run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    p = subprocess.Popen([sys.executable, "-c", LAB_SCRIPT, run_id], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _pids_in(prefix: str) -> list[str]:
    return [pid for ns in list_netns() if ns.startswith(prefix) for pid in run_ip("netns", "pids", ns).split()]


@needs_root
@pytest.mark.parametrize(
    ("sig", "code"),
    [
        (signal.SIGTERM, 128 + signal.SIGTERM),  # the lab turns it into SystemExit
        (signal.SIGINT, -signal.SIGINT),  # Ctrl-C: KeyboardInterrupt unwinds the lab, then Python re-raises it
    ],
)
def test_sigterm_and_sigint_tear_the_lab_down_and_end_its_processes(sig: signal.Signals, code: int) -> None:
    run_id = f"t{sig.name[3:7].lower()}{os.getpid() % 1000}"
    p = _start_lab_process(run_id)
    prefix = f"sluice-{run_id}-"
    sleepers = _pids_in(prefix)
    assert len([ns for ns in list_netns() if ns.startswith(prefix)]) == 4 and sleepers
    p.send_signal(sig)
    assert p.wait(30) == code
    assert [ns for ns in list_netns() if ns.startswith(prefix)] == []
    assert not any(_alive(pid) for pid in sleepers), "the sleeper in the namespace was ended"


def _alive(pid: str) -> bool:
    """Running, not a zombie waiting for its (killed) parent's reaper."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@needs_root
def test_clean_removes_what_a_killed_run_left() -> None:
    run_id = "tkill" + str(os.getpid() % 1000)
    p = _start_lab_process(run_id)
    prefix = f"sluice-{run_id}-"
    sleepers = _pids_in(prefix)
    p.kill()
    p.wait(10)
    assert len([ns for ns in list_netns() if ns.startswith(prefix)]) == 4, "SIGKILL leaves the namespaces"
    gone = clean(run_id)
    assert sorted(gone) == sorted(f"{prefix}{t}" for t in ("routed-n0", "routed-n1", "routed-p0", "routed-p1"))
    assert [ns for ns in list_netns() if ns.startswith(prefix)] == []
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in sleepers), "the sleeper in the namespace was ended"


# ---------------------------------------------------------------------- measurements
@needs_root
def test_allreduce_across_two_namespaces_gives_the_exact_sum(lab: Lab) -> None:
    ep = DATAPATHS["routed"].build(lab, 1500)  # type: ignore[misc]
    res = measure.allreduce(lab, ep, sizes=(4 * 1024, 256 * 1024), rounds=2, budget_s=5)
    assert res["exact"] is True and res["world"] == 2
    assert [r["bytes"] for r in res["sizes"]] == [4096, 262144]
    for row in res["sizes"]:
        # rank r sent (i % 1024) + r: the sum over ranks 0 and 1 is 2 * (i % 1024) + 1
        assert row["sample"] and all(v == 2 * (int(i) % 1024) + 1 for i, v in row["sample"].items())
        assert row["time_s"]["n"] == 2 and row["time_s"]["median"] > 0


@needs_root
@pytest.mark.skipif(tool("iperf3") is None, reason="iperf3 is not installed (scripts/setup.sh installs it)")
def test_iperf3_measures_throughput_cpu_and_the_mss_of_the_mtu(lab: Lab) -> None:
    ep = DATAPATHS["routed"].build(lab, 1500)  # type: ignore[misc]
    r = measure.iperf3(lab, ep, streams=2, duration_s=1, repeats=1)
    assert r["gbps"]["median"] > 0 and r["cpu_s_per_gb"]["median"] > 0
    assert r["tcp_mss"] == 1448  # 1500 - 20 (IP) - 20 (TCP) - 12 (timestamps)


# ---------------------------------------------------------------------- the CLI end to end
@needs_root
def test_cli_bench_recommend_and_apply(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC, "SLUICE_HOME": str(tmp_path / "home")}
    out = tmp_path / "net.json"
    cli = [sys.executable, "-m", "sluice.cli.main", "net"]
    if "__main__" not in Path(SRC, "sluice/cli/main.py").read_text():
        cli = [sys.executable, "-c", "from sluice.cli.main import app; app()", "net"]
    bench = subprocess.run(
        [*cli, "bench", "--datapaths", "routed,loopback", "--skip", "tcp,allreduce,ddp,data", "--repeats", "1",
         "--rr-count", "20", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert "routed" in bench.stdout and json.loads(out.read_text())["datapaths"]["routed"]["mtu"] == 1500
    rec = subprocess.run(
        [*cli, "recommend", "--results", str(out), "--profile", "latency", "--apply", "--interface", "eth9"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    assert "latency: use routed" in rec.stdout and "loopback" in rec.stdout  # excluded, with the reason
    settings = yaml.safe_load((tmp_path / "home" / "settings.yaml").read_text())
    assert settings["net_interface"] == "eth9"
    bad = subprocess.run(
        [*cli, "recommend", "--results", str(out), "--apply"], env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--interface" in bad.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
def test_without_privileges_the_lab_refuses_with_the_reason() -> None:
    setpriv = tool("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": "/tmp"}
    p = subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         "from sluice.cli.main import app; app()", "net", "detect"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "CAP_NET_ADMIN" in p.stderr and "uid 65534" in p.stderr
