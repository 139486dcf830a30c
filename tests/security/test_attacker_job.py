"""A hostile tenant's job, submitted through the API, against a real control plane (`sluice up`,
local engine, SQLite) that runs tenant B's job with a secret: every read, write, signal and
request it tries must fail (docs/security.md, issue 10).

Tenant A's attacker job (jobs/attacker.py) reports what each attempt got; the controls in its
report (what a job may do: its own folders, its own API view) must work, so a failure above
cannot come from a job that could not run at all. Then, from the outside: the modes and owners
of the state at rest, the uids the two jobs run as, and who sees a job's env values.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from sluice.agent.isolation import detect_isolation
from tests.integration.conftest import kill_runs, remove_cgroups
from tests.live_api import free_port
from tests.session_env import clean_env

SLUICE = str(Path(sys.executable).with_name("sluice"))
JOBS = Path(__file__).resolve().parent / "jobs"
WAIT_S = 120.0
"""Readiness deadline (a guard against hanging, not a speed assertion)."""
SECRET = f"s3cret-{uuid.uuid4().hex}"

_iso = detect_isolation("auto")
pytestmark = pytest.mark.skipif(not _iso.enabled, reason=f"needs a plane that may switch users: {_iso.reason}")


class Live:
    def __init__(self, home: Path, url: str, admin: str) -> None:
        self.home, self.url, self.tokens = home, url, {"admin": admin}
        self.http = httpx.Client(base_url=url, timeout=30)

    def call(self, who: str, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.http.request(method, path, headers={"Authorization": f"Bearer {self.tokens[who]}"}, **kw)

    def ok(self, who: str, method: str, path: str, **kw: Any) -> Any:
        r = self.call(who, method, path, **kw)
        assert r.status_code < 300, f"{method} {path} as {who}: {r.status_code} {r.text}"
        return r.json() if r.content else None


def _wait(what: str, cond: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    home = tmp_path / "home"
    cgroup_root = f"sluice-test-{uuid.uuid4().hex[:8]}"
    env = clean_env()  # its own cgroup root below
    env.update(
        SLUICE_HOME=str(home),
        SLUICE_PORT=str(free_port()),
        SLUICE_CGROUP_ROOT=cgroup_root,
        SLUICE_POLICY="kube",
        SLUICE_RECONCILE_INTERVAL_S="0.2",
        SLUICE_STOP_GRACE_S="5",
    )
    up = subprocess.run([SLUICE, "up", "--detach"], env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "isolation is on" in up.stdout, up.stdout + up.stderr
    # And whether one tenant's jobs can connect to another's sockets (agent/net_fence.py).
    said = "network fence: jobs of different tenants cannot connect to each other's sockets"
    assert said in up.stdout or "warning: network fence: jobs of different tenants are NOT fenced" in up.stderr
    said = "Unix-socket fence: each job reaches only the abstract Unix sockets it made"
    assert said in up.stdout or "warning: Unix-socket fence: jobs are NOT fenced" in up.stderr
    info = json.loads((home / "server.json").read_text())
    try:
        yield Live(home, info["url"], (home / "admin.token").read_text().strip())
    finally:
        subprocess.run([SLUICE, "down"], env=env, capture_output=True, timeout=WAIT_S)
        if psutil.pid_exists(int(info["pid"])):
            os.kill(int(info["pid"]), signal.SIGKILL)
        kill_runs(home / "runs")
        remove_cgroups(cgroup_root)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_tenants_job_reaches_nothing_but_its_own(live: Live, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    shutil.copytree(JOBS, jobs)
    jobs.chmod(0o755)
    for name in ("alice", "bob"):
        live.tokens[name] = live.ok("admin", "POST", "/v1/tenants", json={"name": name})["token"]

    victim = live.ok(
        "bob",
        "POST",
        "/v1/jobs",
        json={
            "name": "victim",
            "command": ["python", "victim.py"],
            "workdir": str(jobs),
            "env": {"VICTIM_SECRET": SECRET},
        },
    )
    brun = live.home / "runs" / victim["id"]
    _wait("the victim to be ready", lambda: "victim: ready" in _text(brun / "job.log"))
    victim_pid = int(json.loads((brun / "attempt-1" / "child.json").read_text())["pid"])
    checkpoint = next((brun / "checkpoints").glob("ckpt-*.pt"))
    plane_pid = int(json.loads((live.home / "server.json").read_text())["pid"])

    targets = {
        "home": str(live.home),
        "victim_run": str(brun),
        "victim_checkpoint": str(checkpoint),
        "victim_pid": victim_pid,
        "victim_job": victim["id"],
        "plane_pid": plane_pid,
        "url": live.url,
        "my_token": live.tokens["alice"],
    }
    attacker = live.ok(
        "alice",
        "POST",
        "/v1/jobs",
        json={
            "name": "attacker",
            "command": ["python", "attacker.py"],
            "workdir": str(jobs),
            "env": {"TARGETS": json.dumps(targets), "HUNT": "VICTIM_SECRET="},
        },
    )
    done = _wait(
        "the attacker to finish",
        lambda: (j := live.ok("alice", "GET", f"/v1/jobs/{attacker['id']}"))["phase"] in {"Succeeded", "Failed"} and j,
    )
    log = live.call("alice", "GET", f"/v1/jobs/{attacker['id']}/logs").text
    lines = [ln for ln in log.splitlines() if ln.startswith("ATTACK-REPORT ")]
    assert done["phase"] == "Succeeded" and lines, f"the attacker did not report ({done['reason']}):\n{log}"
    report: dict[str, dict[str, Any]] = json.loads(lines[-1].removeprefix("ATTACK-REPORT "))

    controls = {k: v for k, v in report.items() if k.startswith("control:")}
    attacks = {k: v for k, v in report.items() if not k.startswith("control:")}
    assert len(attacks) >= 25 and all(v["ok"] for v in controls.values()), json.dumps(controls, indent=1)
    succeeded = {k: v["got"] for k, v in attacks.items() if v["ok"]}
    assert not succeeded, "attacks that worked:\n" + json.dumps(succeeded, indent=1)
    assert SECRET not in log

    # The two tenants' jobs ran as two different unprivileged uids, neither the plane's.
    b_uid = (brun / "attempt-1" / "progress.jsonl").stat().st_uid
    a_owner = (live.home / "runs" / attacker["id"] / "work").stat().st_uid
    assert psutil.Process(victim_pid).uids().real == b_uid
    assert len({b_uid, a_owner, os.geteuid()}) == 3 and min(b_uid, a_owner) >= 200_000

    # State at rest.
    assert _mode(live.home) == 0o711
    for name in ("sluice.db", "sluice.db-wal", "sluice.db-shm", "admin.token", "token", "server.json", "server.log"):
        assert _mode(live.home / name) == 0o600, name
    assert _mode(live.home / "runs") == 0o711 and _mode(brun) == 0o711 and brun.stat().st_uid == os.geteuid()
    for own in ("checkpoints", "work"):
        assert (brun / own).stat().st_uid == b_uid and _mode(brun / own) == 0o700, own
    assert _mode(brun / "job.log") == 0o600 and _mode(brun / "attempt-1" / "state.json") == 0o600

    # A job's env values go back to its own tenant only.
    assert live.ok("bob", "GET", f"/v1/jobs/{victim['id']}")["spec"]["env"] == {"VICTIM_SECRET": SECRET}
    assert live.ok("admin", "GET", f"/v1/jobs/{victim['id']}")["spec"]["env"] == {"VICTIM_SECRET": "<redacted>"}
    assert live.call("alice", "GET", f"/v1/jobs/{victim['id']}").status_code == 404
    listed = live.ok("admin", "GET", "/v1/jobs")
    assert SECRET not in json.dumps(listed)

    live.ok("bob", "POST", f"/v1/jobs/{victim['id']}/cancel")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
