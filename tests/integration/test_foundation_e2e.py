"""Issue 2 end to end on the local engine with real processes:

- a crashing job is retried with back-off, resuming from its checkpoint, then Failed;
- the kernel CPU limit of a running job is the one the policy chose, and a re-allocation
  changes it with the same PID (read from the cgroup files the kernel uses);
- `kill -9` of the control plane: on restart every job is accounted for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sluice.control.plane import ControlPlane
from sluice.model import Phase
from sluice.settings import Settings
from sluice.spec import parse_job_spec
from tests.integration.conftest import process_gone, start_server
from tests.live_api import free_port

pytestmark = pytest.mark.integration

JOB = Path(__file__).parent / "jobs" / "steady.py"


def wait_for(cond: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def steady_spec(name: str, pid_file: Path, cpu: float = 0.5, cpu_max: float = 2.0, **env: str) -> dict:
    return {
        "name": name,
        "command": ["python", str(JOB)],
        "workdir": str(JOB.parent),
        "env": {"PID_FILE": str(pid_file), **env},
        "resources": {"cpu": {"min": cpu, "max": cpu_max}},
        "checkpoint": {"interval_s": 1},
        "max_restarts": 2,
    }


def pid_lines(pid_file: Path) -> list[tuple[int, int, int]]:
    if not pid_file.exists():
        return []
    return [tuple(int(x) for x in line.split()) for line in pid_file.read_text().splitlines() if line.strip()]  # type: ignore[misc]


@pytest.fixture
def plane_factory(tmp_path: Path) -> Iterator[Callable[..., ControlPlane]]:
    planes: list[ControlPlane] = []

    def make(**overrides: object) -> ControlPlane:
        settings = Settings(
            home=tmp_path / "home",
            reconcile_interval_s=0.1,
            restart_backoff_s=0.3,
            stop_grace_s=5,
            **overrides,  # type: ignore[arg-type]
        )
        plane = ControlPlane.from_settings(settings)
        plane.bootstrap_tenants()
        plane.start()
        planes.append(plane)
        return plane

    yield make
    for plane in planes:
        admin = next(t for t in plane.store.list_tenants() if t.admin)
        for j in plane.list_jobs(admin):
            if not j.phase.terminal:
                plane.cancel(admin, j.id)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(not j.phase.terminal for j in plane.list_jobs(admin)):
            time.sleep(0.1)
        plane.stop()


def test_crash_retried_with_backoff_resuming_then_failed(plane_factory, tmp_path: Path) -> None:
    plane = plane_factory(policy="kube")
    caller = plane.store.get_tenant("default")
    pid_file = tmp_path / "crash.pids"
    spec = parse_job_spec(steady_spec("crasher", pid_file, STEPS="50", STEP_S="0.05", CKPT_EVERY="2", CRASH_AT="4"))
    job = plane.submit(caller, spec)
    final = wait_for(lambda: (j := plane.get_job(caller, job.id)).phase.terminal and j, 60, "job to end")
    assert final.phase == Phase.FAILED
    assert "exit code 3" in final.reason and "2 restart" in final.reason
    assert final.restarts == 2
    starts = [start for _, _, start in pid_lines(pid_file)]
    assert starts[0] == 0 and len(starts) == 3
    assert all(s >= 4 for s in starts[1:]), f"later attempts must resume from the checkpoint: {starts}"
    reasons = [e.message for e in plane.why(caller, job.id)]
    assert any("back-off" in r for r in reasons)


def _kernel_cpu_limit(pid: int) -> float | None:
    """The CFS limit the kernel applies to `pid`, in cores (None = unlimited), from /proc."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            for root in (base, Path("/sys/fs/cgroup/unified") / path.lstrip("/")):
                f = root / "cpu.max"
                if f.exists():
                    quota, period = f.read_text().split()
                    return None if quota == "max" else int(quota) / int(period)
        elif "cpu" in controllers.split(","):
            base = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            if not (base / "cpu.cfs_quota_us").exists():
                base = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            quota = int((base / "cpu.cfs_quota_us").read_text())
            period = int((base / "cpu.cfs_period_us").read_text())
            return None if quota < 0 else quota / period
    return None


def _cgroups_writable() -> bool:
    return os.access("/sys/fs/cgroup/cpu", os.W_OK) or (
        Path("/sys/fs/cgroup/cgroup.controllers").exists()
        and "cpu" in Path("/sys/fs/cgroup/cgroup.controllers").read_text()
    )


@pytest.mark.skipif(not _cgroups_writable(), reason="no writable cgroup cpu controller on this machine")
def test_flowcon_limit_is_the_kernel_limit_and_changes_live(plane_factory, tmp_path: Path) -> None:
    plane = plane_factory(policy="flowcon", policy_interval_s=1.5)
    caller = plane.store.get_tenant("default")
    files = {n: tmp_path / f"{n}.pids" for n in ("learner", "plateau")}
    jobs = {
        "learner": plane.submit(
            caller, parse_job_spec(steady_spec("learner", files["learner"], STEPS="400", STEP_S="0.1", BURN="1"))
        ),
        "plateau": plane.submit(
            caller,
            parse_job_spec(
                steady_spec("plateau", files["plateau"], STEPS="400", STEP_S="0.1", BURN="1", LOSS_MODE="flat")
            ),
        ),
    }

    wait_for(lambda: all(pid_lines(f) for f in files.values()), 60, "both jobs to start")

    def limit(name: str) -> float | None:
        return plane.get_job(caller, jobs[name].id).allocation.assignments[0].cpu_limit

    def plateau_judged() -> bool:
        completing = any("completing" in e.message for e in plane.why(caller, jobs["plateau"].id) if e.kind == "resize")
        learner, plateau = limit("learner"), limit("plateau")
        return completing and learner is not None and plateau is not None and learner > plateau

    wait_for(plateau_judged, 90, "flowcon to move CPU from the plateaued job to the learner", every=0.5)
    for name, job in jobs.items():
        rec = plane.get_job(caller, job.id)
        assert rec.phase == Phase.RUNNING
        lines = pid_lines(files[name])
        assert len(lines) == 1, "a re-allocation must not restart the job"
        pid = lines[0][0]
        chosen = rec.allocation.assignments[0].cpu_limit
        kernel = _kernel_cpu_limit(pid)
        if chosen is None:
            assert kernel is None
        else:
            assert kernel == pytest.approx(chosen, rel=0.02), f"{name}: kernel {kernel} vs policy {chosen}"


# ------------------------------------------------------------------ kill -9 of the control plane


def _start_server(home: Path, port: int) -> subprocess.Popen[bytes]:
    return start_server(home, port, SLUICE_API_HEADER_TIMEOUT_S="2")


def test_the_server_closes_a_connection_that_never_sends_a_request(tmp_path: Path) -> None:
    """The plane's own server bounds each connection's time to send a request
    (api/connections.py; SLUICE_API_HEADER_TIMEOUT_S is 2 here): 20,000 silent connections,
    no token needed, held every descriptor it had."""
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    server = _start_server(home, port)
    try:
        with socket.create_connection(("127.0.0.1", port)) as silent:
            silent.settimeout(15)
            assert silent.recv(1) == b""
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_kill9_control_plane_accounts_for_every_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    server = _start_server(home, port)
    token = (home / "token").read_text().strip()
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", headers={"Authorization": f"Bearer {token}"})
    files = {n: tmp_path / f"{n}.pids" for n in ("long", "short", "queued")}
    specs = {
        # adopted: still running when the control plane comes back (18 s; the restart comes
        # about 7 s in: the short job's 3.5 s, then a server start)
        "long": steady_spec("long", files["long"], cpu=1.0, STEPS="72", STEP_S="0.25"),
        # finishes while the control plane is down: its exit code is read back from disk
        "short": steady_spec("short", files["short"], cpu=1.0, STEPS="14", STEP_S="0.25"),
        # waits for room the whole time: must still be queued after the restart
        "queued": steady_spec("queued", files["queued"], cpu=1.0, STEPS="4", STEP_S="0.1"),
    }
    ids = {}
    for name in ("long", "short", "queued"):
        r = api.post("/jobs", json=specs[name])
        assert r.status_code in (200, 201), r.text
        ids[name] = r.json()["id"]
    try:
        wait_for(
            lambda: all(api.get(f"/jobs/{ids[n]}").json()["phase"] == "Running" for n in ("long", "short")),
            30,
            "two jobs running",
        )
        assert api.get(f"/jobs/{ids['queued']}").json()["phase"] == "Queued"
        wait_for(lambda: pid_lines(files["short"]) and pid_lines(files["long"]), 60, "both jobs' processes to start")
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
        long_pid = pid_lines(files["long"])[0][0]
        os.kill(long_pid, 0)  # the job outlived its control plane
        short_pid = pid_lines(files["short"])[0][0]
        wait_for(lambda: process_gone(short_pid), 60, "the short job to end while nobody watches")
        server = _start_server(home, port)
        after = {n: api.get(f"/jobs/{ids[n]}").json() for n in ids}
        assert after["long"]["phase"] == "Running"
        assert after["short"]["phase"] in ("Succeeded", "Running")
        assert after["queued"]["phase"] in ("Queued", "Starting", "Running")

        def all_done() -> bool:
            return all(api.get(f"/jobs/{ids[n]}").json()["phase"] == "Succeeded" for n in ids)

        wait_for(all_done, 120, "every job to succeed", every=0.5)
        # never twice: one process per job, the long one adopted with its original PID
        for n in ids:
            lines = pid_lines(files[n])
            assert len(lines) == 1, f"{n} ran {len(lines)} times: {lines}"
        assert pid_lines(files["long"])[0][0] == long_pid
        why = " ".join(e["message"] for e in api.get(f"/jobs/{ids['long']}/why").json()["items"])
        assert "adopted" in why and "run while the plane was down counted" in why
        # Its 72 steps of 0.25 s took at least 18 s, all of them counted against a time limit:
        # the seconds it ran on while no plane watched are charged by the plane that adopted it.
        long = api.get(f"/jobs/{ids['long']}").json()
        assert long["run_s"] >= 17.0
        # what it used, from its cgroup's counter, through the restart: more than nothing,
        # less than its 1-core limit over its run
        assert 0.0 < long["cpu_used_s"] <= long["run_s"] + 1
        used = sum(api.get(f"/jobs/{ids[n]}").json()["cpu_used_s"] for n in ids)
        # the tenant's usage has it too, once the held time is written (every 5 s)
        wait_for(lambda: abs(api.get("/usage").json()[0]["cpu_used_hours"] * 3600 - used) < 0.5, 30, "usage")
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)
        for f in files.values():
            for pid, _, _ in pid_lines(f):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_server_json_points_at_live_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    server = _start_server(home, port)
    try:
        info = json.loads((home / "server.json").read_text())
        assert info["pid"] == server.pid and str(port) in info["url"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=15)
    assert not (home / "server.json").exists()
