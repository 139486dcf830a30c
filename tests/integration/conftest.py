"""Shared fixtures for integration tests that run real job processes.

`sluice_settings` gives each test its own SLUICE_HOME (under tmp_path) and its own cgroup
parent (so parallel or repeated runs never share kernel state); on teardown it kills every
job process group the test's agents started (verified by pid AND create time) and removes
the test's cgroups, so no test leaves processes or cgroups behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sluice.agent.cgroup import remove_root
from sluice.settings import Settings

JOBS = Path(__file__).resolve().parent / "jobs"
SYSFS = Path("/sys/fs/cgroup")


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, every: float = 0.05) -> bool:
    """Poll until `predicate()` holds; a generous ceiling, not a speed assertion."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def start_server(home: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    """A real `python -m sluice.server` of `home` on `port` — kube, 0.2 s rounds, 2 cores, then
    `env` (SLUICE_* settings) — in a session of its own (a test may `killpg` it), its stderr in
    `home/server-<ns>.err`. Returns once /healthz answers 200; fails with that stderr if the
    server exits first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.server"],
        env={
            **os.environ,
            "SLUICE_HOME": str(home),
            "SLUICE_PORT": str(port),
            "SLUICE_POLICY": "kube",
            "SLUICE_RECONCILE_INTERVAL_S": "0.2",
            "SLUICE_NODE_CPUS": "2",
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=open(home / f"server-{time.monotonic_ns()}.err", "wb"),  # noqa: SIM115
        start_new_session=True,
    )

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return proc.poll() is not None  # gone: said below, not waited on

    assert wait_for(up, timeout=60), "the server did not answer /healthz within 60 s"
    errors = "\n".join(p.read_text()[-2000:] for p in sorted(home.glob("server-*.err")))
    assert proc.poll() is None, f"the server exited with {proc.returncode}: {errors}"
    return proc


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_runs(runs_dir: Path) -> None:
    """SIGKILL the process group of every attempt under runs_dir whose shim still runs."""
    for state_file in runs_dir.glob("*/attempt-*/state.json"):
        try:
            state = json.loads(state_file.read_text())
            proc = psutil.Process(int(state["shim_pid"]))
            if abs(proc.create_time() - float(state["shim_create_time"])) > 1.0:
                continue
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except (OSError, ValueError, KeyError, psutil.Error):
            continue


def wait_exited(agent: Any, job_id: str, timeout_s: float = 60.0) -> Any:
    """The JobExited of `job_id` from a NodeAgent's poll (a guard against hanging, not a timing
    assertion)."""
    from sluice.model import JobExited

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for e in agent.poll():
            if isinstance(e, JobExited) and e.job_id == job_id:
                return e
        time.sleep(0.05)
    pytest.fail(f"{job_id} did not end")


def remove_cgroups(name: str) -> None:
    """rmdir the test's cgroup root in every hierarchy (v1 `cpu/<name>`, ..., and v2's
    `<name>` at the mount's top: a glob of `*/<name>` alone left those behind on a v2 host),
    children first, and the root's network-fence tables once its groups are gone."""
    remove_root(name, SYSFS)


def plane_settings(folder: Path) -> Settings:
    """Settings of a test plane whose home is under `folder`, with a cgroup parent of its own."""
    return Settings(
        home=folder / "home",
        cgroup_root=f"sluice-test-{uuid.uuid4().hex[:8]}",
        stop_grace_s=10.0,
        usage_sample_s=0.25,
        kpi_sample_s=1.0,
    )


def clean_up(settings: Settings) -> None:
    """Kill every job process group the plane's agents started and remove its cgroups."""
    kill_runs(settings.runs_dir)
    assert settings.cgroup_root is not None
    remove_cgroups(settings.cgroup_root)


@pytest.fixture
def sluice_settings(tmp_path: Path) -> Iterator[Settings]:
    settings = plane_settings(tmp_path)
    yield settings
    clean_up(settings)


@pytest.fixture
def moto_s3() -> Iterator[tuple[str, Any]]:
    """A moto S3 server on loopback with an empty bucket `data`: (endpoint URL, boto3 client).

    moto keeps its buckets in process-wide state, shared by every server in this process, so
    the store is reset first, whatever another test left."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    try:
        host, port = srv.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30)
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
        )
        s3.create_bucket(Bucket="data")
        yield endpoint, s3
    finally:
        srv.stop()
