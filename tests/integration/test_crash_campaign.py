"""`kill -9` of the control plane again and again, at moments nobody chose, while its jobs
are preempted, suspended, resumed, cancelled and crash, one of them a gang of two replicas: the named crash points
(tests/unit/test_resize_crash.py, test_cli_up.py) each cover one moment; this covers the ones
between them.

A real server on the local engine (2 cores, and a 2-core quota on the default queue so that a
higher priority preempts: 2 one-core jobs at once), real job processes
(tests/integration/jobs/steady.py, each holding an exclusive lock while it runs), and a killer
that SIGKILLs the server every CRASH_GAP_S seconds (seeded; SLUICE_CRASH_KILLS and
SLUICE_CRASH_SEED make a longer or another campaign; SLUICE_CRASH_KEEP=DIR keeps a failed
campaign's home and PID files there) and starts it again at once. What must
hold whatever the moments were:
- every job ends as its story says (the preempted and the suspended ones Succeeded, the
  cancelled one Cancelled, the crashing one Failed after exactly its retries);
- no two processes of one job (of one replica of the gang) ever ran at once (the lock), and
  no attempt number started twice (one line per attempt in the job's PID file);
- every attempt after the first resumed from a checkpoint no older than the one before it;
- no job process is left when the campaign ends.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sluice.client import Client, SluiceError
from sluice.model import Phase
from tests.integration.conftest import start_server, wait_for
from tests.live_api import free_port

pytestmark = pytest.mark.integration

JOB = Path(__file__).parent / "jobs" / "steady.py"
KILLS = int(os.environ.get("SLUICE_CRASH_KILLS", "8"))
SEED = int(os.environ.get("SLUICE_CRASH_SEED", "0"))
CRASH_GAP_S = (1.0, 4.0)
"""Seconds between one server's answer to /healthz and its kill, drawn uniformly."""


def _start(home: Path, port: int) -> subprocess.Popen[bytes]:
    return start_server(home, port, SLUICE_PREEMPT_MIN_RUNTIME_S="1")


def _spec(name: str, tmp: Path, priority: int = 0, max_restarts: int = 3, replicas: int = 1, **env: str) -> dict:
    if replicas > 1:
        env["PER_RANK"] = "1"
    return {
        "name": name,
        "command": ["python", str(JOB)],
        "workdir": str(JOB.parent),
        "env": {"PID_FILE": str(tmp / f"{name}.pids"), "LOCK_FILE": str(tmp / f"{name}.lock"), **env},
        "resources": {"cpu": {"min": 1.0 / replicas, "max": 1.0}, "replicas": {"min": replicas, "max": replicas}},
        "checkpoint": {"interval_s": 1},
        "priority": priority,
        "max_restarts": max_restarts,
    }


def _runs_steady(pid: int) -> bool:
    """Whether `pid` is a live steady.py (pids are reused: pid_max may be 32768)."""
    try:
        return JOB.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_repeated_kill9_of_the_plane_loses_no_job_and_never_runs_one_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    rng = random.Random(SEED)
    server = _start(home, port)
    client = Client(f"http://127.0.0.1:{port}", (home / "token").read_text().strip(), timeout_s=10)
    with Client(f"http://127.0.0.1:{port}", (home / "admin.token").read_text().strip()) as admin:
        admin.update_queue("default", {"nominal": {"cores": 2}})  # so that priority preempts
    names = [f"low{i}" for i in range(5)]
    ids: dict[str, str] = {}

    def submit(name: str, **kw: object) -> None:
        ids[name] = client.submit(_spec(name, tmp_path, **kw)).id  # type: ignore[arg-type]

    # (at, what): the story, told against the campaign's clock while the killer works
    story: list[tuple[float, str]] = [(3.0, "high"), (5.0, "suspend"), (7.0, "cancel"), (14.0, "resume")]
    try:
        for name in names:
            submit(name, STEPS="32", STEP_S="0.25")
        submit("crasher", STEPS="32", STEP_S="0.1", CRASH_AT="3", max_restarts=1)
        submit("gang", replicas=2, STEPS="24", STEP_S="0.25")
        t0 = time.monotonic()
        kills = 0
        while kills < KILLS or story:
            deadline = time.monotonic() + rng.uniform(*CRASH_GAP_S)
            while time.monotonic() < deadline:
                if story and time.monotonic() - t0 >= story[0][0]:
                    what = story.pop(0)[1]
                    with contextlib.suppress(SluiceError):  # an ended job: what it ended as is checked below
                        if what == "high":
                            submit("high0", priority=10, STEPS="20", STEP_S="0.25")
                            submit("high1", priority=10, STEPS="20", STEP_S="0.25")
                        elif what == "suspend":
                            client.suspend(ids["low3"])
                        elif what == "cancel":
                            client.cancel(ids["low4"])
                        elif what == "resume":
                            client.resume(ids["low3"])
                time.sleep(0.05)
            if kills < KILLS:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=10)
                kills += 1
                server = _start(home, port)

        def ended() -> bool:
            return all(Phase(client.job(i).phase).terminal for i in ids.values())

        assert wait_for(ended, timeout=240, every=0.5), (
            f"timed out after 240 s waiting for every job to end (seed {SEED})"
        )
        jobs = {n: client.job(i) for n, i in ids.items()}
        seen = {n: f"{j.phase} restarts {j.restarts}: {j.reason}" for n, j in jobs.items()}
        pids = {p.name: _lines(p) for p in sorted(tmp_path.glob("*.pids*"))}
        context = f"seed {SEED}, {KILLS} kills: {seen}; attempts (pid, attempt, first step): {pids}"
        for n in [*names[:4], "high0", "high1", "gang"]:
            assert str(jobs[n].phase) == "Succeeded", context
        assert str(jobs["low4"].phase) in ("Cancelled", "Succeeded"), context  # it may have ended first
        assert str(jobs["crasher"].phase) == "Failed" and jobs["crasher"].restarts == 1, context
        files = {n: tmp_path / f"{n}.pids" for n in ids if n != "gang"}
        files |= {f"gang rank {r}": tmp_path / f"gang.pids.r{r}" for r in (0, 1)}
        for n, path in files.items():
            lines = _lines(path)
            assert lines or n == "low4", f"{n} never ran; {context}"
            lock = path.with_name(path.name.replace(".pids", ".lock"))
            assert not lines or lock.exists(), f"{n} ran without taking its lock {lock.name}"
            assert not [x for x in lines if x[0] == "DOUBLE"], f"two processes of {n} at once: {lines}; {context}"
            attempts = [int(x[1]) for x in lines]
            assert len(attempts) == len(set(attempts)) and attempts == sorted(attempts), (n, lines, context)
            starts = [int(x[2]) for x in lines]
            if n != "crasher":
                assert starts == sorted(starts), f"{n} resumed from an older checkpoint: {lines}; {context}"
            for pid in (int(x[0]) for x in lines):
                assert not _runs_steady(pid), f"{n}'s process {pid} outlived its job; {context}"
        why = "\n".join(f"{e.time} {e.message}" for e in client.why(ids["crasher"]))
        ran = pids["crasher.pids"]
        assert len(ran) == 2, f"the crasher ran {ran}; seed {SEED}:\n{why}"
        # the story happened: some job was preempted and resumed from a checkpoint
        assert any(int(x[2]) > 0 for n in names for x in _lines(tmp_path / f"{n}.pids")), context
    except AssertionError:
        if os.environ.get("SLUICE_CRASH_KEEP"):  # the home and PID files, to look into
            import shutil

            shutil.copytree(tmp_path, os.environ["SLUICE_CRASH_KEEP"], symlinks=True, dirs_exist_ok=True)
        raise
    finally:
        client.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        for path in tmp_path.glob("*.pids*"):
            for line in _lines(path):
                pid = int(line[1] if line[0] == "DOUBLE" else line[0])
                if _runs_steady(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
