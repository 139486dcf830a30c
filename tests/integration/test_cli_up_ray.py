"""`sluice up --engine ray --address ADDR` as a user runs it: a real server process joins a
real multi-node Ray cluster (ray.cluster_utils.Cluster on this machine); nodes that join or
leave the cluster show up in `sluice node list`, a job submitted with the CLI runs on a Ray
node, and a queue's quota holds a job back on Ray as on the local engine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.ray_timing import FAST_NODE_DEATH  # noqa: E402
from tests.session_env import clean_env  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(300)]

SLUICE = str(Path(sys.executable).with_name("sluice"))
OBJECT_STORE = 80 * 1024 * 1024
WAIT_S = 120.0
"""Deadline for a state to be reached (a guard against hanging, not a speed assertion)."""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "labels": {"sluice.node": "h0"},
            "_system_config": FAST_NODE_DEATH,
        },
    )
    try:
        c.add_node(num_cpus=1, object_store_memory=OBJECT_STORE, labels={"sluice.node": "w1"})
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    # whatever a failed test left: the server, by its recorded pid
    with contextlib.suppress(OSError, ValueError, KeyError):
        os.kill(int(json.loads((home / "server.json").read_text())["pid"]), signal.SIGKILL)


def sluice(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["SLUICE_HOME"] = str(home)
    return subprocess.run([SLUICE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def nodes(home: Path) -> dict[str, dict[str, Any]]:
    out = sluice(home, "node", "list", "-o", "json")
    assert out.returncode == 0, out.stderr
    return {n["name"]: n for n in json.loads(out.stdout)}


def eventually(what: Callable[[], bool], message: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not what():
        assert time.monotonic() < deadline, message()
        time.sleep(1.0)


def test_up_joins_a_ray_cluster_tracks_its_nodes_and_runs_a_job_there(
    cluster: Cluster, home: Path, tmp_path: Path
) -> None:
    up = sluice(
        home, "up", "--detach", "--port", "0", "--policy", "kube", "--engine", "ray", "--address", cluster.address
    )
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        eventually(lambda: {"h0", "w1"} <= set(nodes(home)), lambda: f"nodes: {nodes(home)}")

        # a node that joins the Ray cluster appears ...
        w2 = cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE, labels={"sluice.node": "w2"})
        cluster.wait_for_nodes()
        eventually(lambda: nodes(home).get("w2", {}).get("health") == "Healthy", lambda: f"nodes: {nodes(home)}")

        # ... a job submitted with the CLI runs on a Ray node ...
        done = tmp_path / "ran-on"
        script = "import os, pathlib, sys; pathlib.Path(sys.argv[1]).write_text(os.environ['SLUICE_NODE'])"
        (tmp_path / "job.json").write_text(
            json.dumps({"name": "hello", "command": ["python", "-c", script, str(done)], "resources": {"cpu": 1}})
        )
        sub = sluice(home, "job", "submit", str(tmp_path / "job.json"))
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.strip()

        def phase(job: str) -> str:
            got = sluice(home, "job", "get", job, "-o", "json")
            return str(json.loads(got.stdout)["phase"]) if got.returncode == 0 else got.stderr

        eventually(lambda: phase(job_id) == "Succeeded", lambda: f"job {job_id}: {phase(job_id)}")
        assert done.read_text() in {"h0", "w1", "w2"}

        # ... queues admit on Ray as they do on the local engine (the controller's admission):
        # a 1-core quota runs one 1-core job and holds the next with the quota's reason
        for args in (("queue", "create", "solo", "--cores", "1"), ("queue", "grant", "solo", "default")):
            r = sluice(home, *args)
            assert r.returncode == 0, r.stdout + r.stderr
        nap = {"name": "nap", "queue": "solo", "command": ["python", "-c", "import time; time.sleep(5)"]}
        (tmp_path / "nap.json").write_text(json.dumps({**nap, "resources": {"cpu": 1}}))
        first, second = (sluice(home, "job", "submit", str(tmp_path / "nap.json")).stdout.strip() for _ in range(2))
        eventually(lambda: phase(first) == "Running", lambda: f"job {first}: {phase(first)}")
        held = json.loads(sluice(home, "job", "get", second, "-o", "json").stdout)
        assert held["phase"] == "Pending" and held["reason"].startswith("queue solo: cores 1/1 nominal"), held
        eventually(lambda: phase(second) == "Succeeded", lambda: f"job {second}: {phase(second)}")
        assert phase(first) == "Succeeded"

        # ... a gang's replicas each log on their node; --all-replicas reads them all, by rank
        hi = {"name": "hi", "command": ["python", "-c", "import os; print('hi from', os.environ['RANK'])"]}
        (tmp_path / "hi.json").write_text(json.dumps({**hi, "resources": {"cpu": 1, "replicas": {"min": 2}}}))
        gang = sluice(home, "job", "submit", str(tmp_path / "hi.json")).stdout.strip()
        eventually(lambda: phase(gang) == "Succeeded", lambda: f"job {gang}: {phase(gang)}")
        every = sluice(home, "job", "logs", gang, "--all-replicas")
        assert every.returncode == 0, every.stderr
        assert "[rank0] hi from 0\n" in every.stdout and "[rank1] hi from 1\n" in every.stdout, every.stdout
        assert "hi from 1" not in sluice(home, "job", "logs", gang).stdout  # the plain view is rank 0's

        # ... and a node that leaves is no longer usable
        cluster.remove_node(w2, allow_graceful=False)
        eventually(lambda: nodes(home).get("w2", {}).get("health") in (None, "Lost"), lambda: f"nodes: {nodes(home)}")
        assert nodes(home)["w1"]["health"] == "Healthy"
    finally:
        down = sluice(home, "down")
        assert down.returncode == 0, down.stdout + down.stderr
