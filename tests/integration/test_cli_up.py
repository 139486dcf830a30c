"""`sluice up --detach` / `sluice down` as a user runs them: a real server process on the local
engine, a real job process that outlives a graceful stop and is adopted by the next start."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.session_env import clean_env

pytestmark = pytest.mark.integration

SLUICE = str(Path(sys.executable).with_name("sluice"))
WAIT_S = 90.0
"""Readiness deadline (a guard against hanging, not an assertion about speed)."""

JOB = """\
import pathlib, sys, time
stop = pathlib.Path(sys.argv[1])
i = 0
while not stop.exists():
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.2)
print("bye", flush=True)
"""


def _ours(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            out.append(p)
    return out


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    yield home
    # Clean up whatever a failed test left: the server (by its recorded pid) and the job.
    try:
        pid = int(json.loads((home / "server.json").read_text())["pid"])
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        pass
    for p in _ours(str(tmp_path / "stop")):
        p.kill()


def run(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env["SLUICE_HOME"] = str(home)
    return subprocess.run([SLUICE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def job(home: Path, job_id: str) -> dict[str, Any]:
    """The job through the API directly (each CLI process costs a second of imports)."""
    url = json.loads((home / "server.json").read_text())["url"]
    token = (home / "token").read_text().strip()
    r = httpx.get(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def wait_for(home: Path, job_id: str, phases: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        j = job(home, job_id)
        if j["phase"] in phases or time.monotonic() > deadline:
            return j
        time.sleep(0.2)


def test_up_submit_down_up_adopts_running_job(home: Path, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    stop = tmp_path / "stop"
    (tmp_path / "job.yaml").write_text(
        json.dumps({"name": "ticker", "command": ["python", "job.py", str(stop)], "resources": {"cpu": 0.5}})
    )
    up = run(home, "up", "--detach", "--port", "0", "--policy", "kube")
    assert up.returncode == 0, up.stdout + up.stderr
    url = up.stdout.strip().splitlines()[-1]
    assert url.startswith("http://127.0.0.1:")
    for name in ("token", "admin.token"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
    assert json.loads((home / "server.json").read_text())["url"] == url

    sub = run(home, "job", "submit", str(tmp_path / "job.yaml"))
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert wait_for(home, job_id, {"Running"})["phase"] == "Running"

    down = run(home, "down")
    assert down.returncode == 0 and "1 running job keeps running" in down.stdout, down.stdout
    assert not (home / "server.json").exists()
    assert _ours(str(tmp_path / "stop")), "the job process must survive a graceful stop"
    assert run(home, "job", "list").returncode == 1  # nobody serves now

    again = run(home, "up", "--detach", "--port", "0", "--policy", "kube")
    assert again.returncode == 0, again.stdout + again.stderr
    adopted = job(home, job_id)
    assert adopted["phase"] == "Running" and adopted["attempt"] == 1 and adopted["restarts"] == 0

    stop.touch()
    logs = run(home, "job", "logs", job_id, "-f")
    assert logs.returncode == 0 and "tick 0" in logs.stdout and "bye" in logs.stdout
    final = run(home, "job", "get", job_id, "-o", "json")
    assert final.returncode == 0 and json.loads(final.stdout)["phase"] == "Succeeded"
    down = run(home, "down")
    assert down.returncode == 0 and "no job was running" in down.stdout, down.stdout


def test_a_relative_home_runs_jobs(home: Path, tmp_path: Path) -> None:
    """`SLUICE_HOME=home` from the folder that holds it: each process (the plane, the job's
    supervisor, the job) resolved it against its own working folder, and every job failed to
    launch with an empty log (red team s22)."""
    env = clean_env()
    env["SLUICE_HOME"] = home.name

    def here(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SLUICE, *args], env=env, cwd=home.parent, capture_output=True, text=True, timeout=120)

    up = here("up", "--detach", "--port", "0", "--policy", "kube")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        spec = {"name": "rel", "command": ["python", "-c", "print('hello from a relative home')"]}
        (tmp_path / "rel.json").write_text(json.dumps({**spec, "resources": {"cpu": 0.5}}))
        sub = here("job", "submit", str(tmp_path / "rel.json"))
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.strip()
        assert wait_for(home, job_id, {"Succeeded", "Failed"})["phase"] == "Succeeded", job(home, job_id)
        assert "hello from a relative home" in here("job", "logs", job_id).stdout
    finally:
        assert here("down").returncode == 0


def test_a_server_killed_between_recording_a_launch_and_making_it_recovers_the_job_once(
    home: Path, tmp_path: Path
) -> None:
    """A real crash at a named failure point: the server process exits (status 86, no
    clean-up) right after writing "Starting, attempt 1" and before starting the process. The
    next `sluice up` finds no process of attempt 1, requeues the job without counting a
    failure, and it runs exactly once, as attempt 2."""
    (tmp_path / "job.py").write_text(JOB)
    stop = tmp_path / "stop"
    stop.touch()  # the job ends at once when it runs
    (tmp_path / "job.yaml").write_text(
        json.dumps({"name": "once", "command": ["python", "job.py", str(stop)], "resources": {"cpu": 0.5}})
    )
    env = clean_env()
    env |= {"SLUICE_HOME": str(home), "SLUICE_FAILPOINTS": "book.transition.after_write=exit@2"}
    up = subprocess.run(
        [SLUICE, "up", "--detach", "--port", "0", "--policy", "kube"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    pid = int(json.loads((home / "server.json").read_text())["pid"])
    # The round that crashes may run while the submit request is still being answered: the
    # job is on disk either way (it is written before the round can see it).
    run(home, "job", "submit", str(tmp_path / "job.yaml"))
    deadline = time.monotonic() + WAIT_S
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the armed failure point never fired"
        time.sleep(0.1)

    again = run(home, "up", "--detach", "--port", "0", "--policy", "kube")
    assert again.returncode == 0, again.stdout + again.stderr
    listed = run(home, "job", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    [job_id] = [j["id"] for j in json.loads(listed.stdout) if j["name"] == "once"]
    final = wait_for(home, job_id, {"Succeeded", "Failed", "Cancelled"})
    assert final["phase"] == "Succeeded", final
    assert final["attempt"] == 2 and final["restarts"] == 0
    logs = run(home, "job", "logs", job_id)
    assert logs.stdout.count("bye") == 1, "the job ran more than once"
    assert run(home, "down").returncode == 0


def test_up_on_a_gpu_box_says_which_gpus_it_hands_out(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`nvidia-smi` here is a FAKE listing two GPUs (tests/unit/test_gpus.py; the real one ran on
    an H100 and an H200): `sluice up` names the GPUs and where it found them, and the node offers
    them. GPU 1 is in MIG mode without instances: it is left out and `sluice up` says why
    (before, it was handed out, and CUDA showed the job given it no device). One plane for both
    cases (they were two runs of `sluice up`, 8 s each)."""
    from tests.unit.test_gpus import TWO_GPUS, fake_smi

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi(bin_dir, TWO_GPUS, modes="0, Disabled\n1, Enabled\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    up = run(home, "up", "--detach", "--port", "0", "--policy", "kube")
    assert up.returncode == 0, up.stdout + up.stderr
    said = "GPUs to hand out: 0 (found with nvidia-smi -L); left out: GPU 1 (MIG mode is on and it has no MIG"
    assert said in up.stdout, up.stdout
    nodes = run(home, "node", "list", "-o", "json")
    assert nodes.returncode == 0 and [n["gpus"] for n in json.loads(nodes.stdout)] == [1], nodes.stdout
    # And how the jobs are kept off the GPUs they were not given (docs/security.md), or,
    # as a warning, why they are not.
    fenced = "GPU fence: each job is fenced from the GPUs it was not given by" in up.stdout
    assert fenced != ("warning: GPU fence: jobs are NOT fenced" in up.stderr), up.stdout + up.stderr
    if os.geteuid() == 0 and Path("/sys/fs/cgroup/devices/devices.deny").exists():
        assert "by the cgroup v1 devices controller" in up.stdout, up.stdout
    assert run(home, "down").returncode == 0
