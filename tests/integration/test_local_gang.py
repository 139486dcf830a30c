"""Gang-launched replicas on the local engine (issue 12), with real processes.

- replicas get torchrun's variables, run on their assigned virtual node's cores, and write
  into the job's one log, each line prefixed with its rank;
- all or nothing: a replica that cannot start takes the started ones down, one exit;
- a replica that dies stops the others, one exit with its code;
- examples/ddp.py (gloo, CPU) on 2 replicas finishes with the same parameters on every rank;
- through the control plane, killing one replica restarts the job from its checkpoint.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sluice.control.plane import ControlPlane
from sluice.engine.local import LocalEngine
from sluice.model import Allocation, Assignment, Event, JobExited, JobProgress, JobStarted, LaunchRequest, Phase
from sluice.settings import Settings
from sluice.spec import JobSpec, load_job_spec, parse_job_spec
from tests.integration.conftest import process_gone, wait_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHOW_ENV = (
    "import os; v = [os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', "
    "'GROUP_RANK', 'GROUP_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')]; "
    "print('env', *v, ','.join(map(str, sorted(os.sched_getaffinity(0)))))"
)


@pytest.fixture
def engine2(sluice_settings: Settings) -> Iterator[LocalEngine]:
    if len(psutil.Process().cpu_affinity() or []) < 2:
        pytest.skip("needs at least 2 cores to split into virtual nodes")
    e = LocalEngine(sluice_settings.model_copy(update={"virtual_nodes": 2}))
    yield e
    e.close()


def _gang(nodes: list[str], cpu: float = 0.5, gpus: tuple[int, ...] = ()) -> Allocation:
    return Allocation(tuple(Assignment(n, cpu, cpu, gpus[k] if gpus else 0) for k, n in enumerate(nodes)))


def _until_exit(engine: LocalEngine, job_id: str, timeout: float) -> list[Event]:
    seen: list[Event] = []

    def exited() -> bool:
        seen.extend(engine.poll())
        return any(isinstance(e, JobExited) and e.job_id == job_id for e in seen)

    assert wait_for(exited, timeout=timeout, every=0.1), Path(engine.log_path(job_id) or "/dev/null").read_text()
    time.sleep(0.3)
    seen.extend(engine.poll())  # nothing more of the job may follow its exit
    return [e for e in seen if getattr(e, "job_id", None) == job_id]


def test_replicas_get_torchrun_env_their_node_cores_and_one_prefixed_log(engine2: LocalEngine, tmp_path: Path) -> None:
    nodes = {n.name: {int(c) for c in n.labels["cores"].split(",")} for n in engine2.nodes()}
    spec = JobSpec(command=["python", "-c", SHOW_ENV], workdir=str(tmp_path))
    engine2.launch(LaunchRequest("g3", 1, "t", spec, _gang(["node-0", "node-1", "node-0"]), str(tmp_path / "ck")))
    events = _until_exit(engine2, "g3", timeout=60)
    assert [type(e) for e in events if isinstance(e, JobStarted | JobExited)] == [JobStarted, JobExited]
    assert next(e for e in events if isinstance(e, JobExited)).exit_code == 0
    log = Path(engine2.log_path("g3") or "").read_text()
    lines = {ln.split()[0]: ln.split()[2:] for ln in log.splitlines() if " env " in ln}
    assert set(lines) == {"[rank0]", "[rank1]", "[rank2]"}, log
    port = lines["[rank0]"][7]
    # RANK LOCAL_RANK WORLD LOCAL_WORLD GROUP_RANK GROUP_WORLD: node-0 holds ranks 0 and 2
    assert lines["[rank0]"][:7] == ["0", "0", "3", "2", "0", "2", "127.0.0.1"]
    assert lines["[rank1]"][:7] == ["1", "0", "3", "1", "1", "2", "127.0.0.1"]
    assert lines["[rank2]"][:7] == ["2", "1", "3", "2", "0", "2", "127.0.0.1"]
    assert all(v[7] == port for v in lines.values())
    for rank, node in (("[rank0]", "node-0"), ("[rank1]", "node-1"), ("[rank2]", "node-0")):
        assert {int(c) for c in lines[rank][8].split(",")} <= nodes[node]
    assert "[rank1] [sluice] attempt ended: exited with code 0" in log
    assert engine2.alive() == {}


def test_a_replica_that_cannot_start_takes_the_gang_down(engine2: LocalEngine, tmp_path: Path) -> None:
    spec = JobSpec(command=["python", "-c", "import time; time.sleep(120)"], workdir=str(tmp_path))
    # rank 1 asks for a GPU its node does not have: its launch fails after rank 0 started
    engine2.launch(
        LaunchRequest("nogpu", 1, "t", spec, _gang(["node-0", "node-1"], gpus=(0, 1)), str(tmp_path / "ckpt"))
    )
    events = _until_exit(engine2, "nogpu", timeout=30)
    exits = [e for e in events if isinstance(e, JobExited)]
    assert len(exits) == 1 and exits[0].exit_code == 127 and "GPU" in exits[0].reason
    assert not any(isinstance(e, JobStarted) for e in events)
    rank0 = engine2.agents["node-0"].attempt_dir("nogpu--r0of2", 1)
    shim = json.loads((rank0 / "state.json").read_text())["shim_pid"]
    assert process_gone(shim)
    assert json.loads((rank0 / "stop.json").read_text())["signal"] == "SIGKILL"  # killed, no grace
    assert engine2.alive() == {}


def test_one_replica_dying_stops_the_others_and_the_job_exits_once(engine2: LocalEngine, tmp_path: Path) -> None:
    code = "import os, sys, time; time.sleep(0.5); sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)"
    spec = JobSpec(command=["python", "-c", code], workdir=str(tmp_path))
    engine2.launch(LaunchRequest("die", 1, "t", spec, _gang(["node-0", "node-1", "node-1"]), str(tmp_path / "ckpt")))
    events = _until_exit(engine2, "die", timeout=30)  # the others end on SIGTERM, well inside the grace
    exits = [e for e in events if isinstance(e, JobExited)]
    assert len(exits) == 1 and exits[0].exit_code == 3, exits
    log = Path(engine2.log_path("die") or "").read_text()
    assert "[rank0] [sluice] attempt ended: killed by signal 15" in log, log
    assert engine2.alive() == {}


def _ddp_spec(steps: int, stats: Path, **extra: object) -> JobSpec:
    spec = load_job_spec(EXAMPLES / "ddp.yaml")
    command = ["python", "ddp.py", "--steps", str(steps), "--width", "64", "--stats", str(stats)]
    return spec.model_copy(update={"command": command, **extra})


def _stats(folder: Path, world: int) -> list[dict[str, object]]:
    return [json.loads((folder / f"stats{r}.json").read_text()) for r in range(world)]


def test_ddp_example_on_two_replicas_ends_with_equal_parameters(engine2: LocalEngine, tmp_path: Path) -> None:
    spec = _ddp_spec(60, tmp_path / "stats{rank}.json")
    req = LaunchRequest("ddp", 1, "t", spec, _gang(["node-0", "node-1"], cpu=1.0), str(tmp_path / "ck"))
    engine2.launch(req)
    events = _until_exit(engine2, "ddp", timeout=120)
    exited = next(e for e in events if isinstance(e, JobExited))
    assert exited.exit_code == 0, Path(engine2.log_path("ddp") or "").read_text()
    progress = [e for e in events if isinstance(e, JobProgress)]
    assert progress and progress[-1].step == 59 and progress[-1].metrics["total_steps"] == 60
    stats = _stats(tmp_path, 2)
    assert [s["rank"] for s in stats] == [0, 1] and all(s["last"] == 59 for s in stats)
    assert stats[0]["params_sha256"] == stats[1]["params_sha256"], "DDP keeps every rank's model the same"
    marks = stats[0]["marks"]  # (step, wall clock) from the first step to the last: `bench elastic`'s steady rate
    assert isinstance(marks, list) and marks[0][0] == 0 and marks[-1] == [59, stats[0]["t_end"]]
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(marks))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    settings = Settings(home=tmp_path / "home", reconcile_interval_s=0.1, restart_backoff_s=0.3, stop_grace_s=5)
    p = ControlPlane.from_settings(settings)
    p.bootstrap_tenants()
    p.start()
    yield p
    admin = next(t for t in p.store.list_tenants() if t.admin)
    for j in p.list_jobs(admin):
        if not j.phase.terminal:
            p.cancel(admin, j.id)
    wait_for(lambda: all(j.phase.terminal for j in p.list_jobs(admin)), timeout=15)
    p.stop()


def _story(plane: ControlPlane, caller: Any, job_id: str) -> str:
    """What a failed wait shows: the job's phase, every event's reason and its log's end."""
    rec = plane.get_job(caller, job_id)
    why = "\n".join(f"  {e.kind}: {e.message}" for e in plane.why(caller, job_id))
    log = plane.log_path(caller, job_id)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else "(no log)"
    return f"{rec.phase} {rec.reason!r} requeues={rec.requeues}\n{why}\n--- log:\n{tail}"


def test_killing_one_replica_restarts_the_gang_from_its_checkpoint(plane: ControlPlane, tmp_path: Path) -> None:
    caller = plane.store.get_tenant("default")
    steps = 800  # ~100 a second here: attempt 1 still runs at its first checkpoint
    raw = {
        "name": "ddp-kill",
        "command": ["python", "ddp.py", "--steps", str(steps), "--width", "64"],
        "workdir": str(EXAMPLES),
        "resources": {"cpu": {"min": 0.5, "max": 1}, "replicas": {"min": 2, "max": 2}},
        "checkpoint": {"interval_s": 1, "keep": 2},
        "max_restarts": 2,
    }
    raw["command"] += ["--stats", str(tmp_path / "stats{rank}.json")]
    job = plane.submit(caller, parse_job_spec(raw))
    running = wait_for(lambda: (plane.get_job(caller, job.id).checkpoint_step or 0) > 0, timeout=60, every=0.2)
    assert running, _story(plane, caller, job.id)
    child = plane.settings.runs_dir / f"{job.id}--r1of2" / "attempt-1" / "child.json"
    os.kill(int(json.loads(child.read_text())["pid"]), signal.SIGKILL)
    assert wait_for(lambda: plane.get_job(caller, job.id).phase.terminal, timeout=90, every=0.2)
    final = plane.get_job(caller, job.id)
    assert final.phase == Phase.SUCCEEDED, final.reason
    assert final.attempt == 2 and final.restarts == 1
    stats = _stats(tmp_path, 2)  # written by attempt 2
    assert all(isinstance(s["start"], int) and s["start"] > 0 for s in stats), stats
    assert stats[0]["params_sha256"] == stats[1]["params_sha256"]
    reasons = " ".join(e.message for e in plane.why(caller, job.id))
    assert "killed by signal 9" in reasons, reasons


def test_a_gpu_box_without_cuda_visible_devices_hands_out_its_gpus(
    sluice_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plane's environment names no GPUs; the machine's `nvidia-smi -L` lists two (a FAKE
    here, tests/unit/test_gpus.py; the real one ran on an H100). Each virtual node offers one,
    and each replica sees only its node's. Before, no GPUs were offered at all."""
    from tests.unit.test_gpus import TWO_GPUS, fake_smi

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi(bin_dir, TWO_GPUS)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if len(psutil.Process().cpu_affinity() or []) < 2:
        pytest.skip("needs at least 2 cores to split into virtual nodes")
    engine = LocalEngine(sluice_settings.model_copy(update={"virtual_nodes": 2}))
    try:
        assert {n.name: n.gpus for n in engine.nodes()} == {"node-0": 1, "node-1": 1}
        code = "import os; print('gpus', os.environ['RANK'], repr(os.environ['CUDA_VISIBLE_DEVICES']))"
        spec = JobSpec(command=["python", "-c", code], workdir=str(tmp_path))
        engine.launch(LaunchRequest("g", 1, "t", spec, _gang(["node-0", "node-1"], gpus=(1, 1)), str(tmp_path / "c")))
        events = _until_exit(engine, "g", timeout=60)
        assert next(e for e in events if isinstance(e, JobExited)).exit_code == 0
        log = Path(engine.log_path("g") or "").read_text()
        assert "[rank0] gpus 0 '0'" in log and "[rank1] gpus 1 '1'" in log, log
    finally:
        engine.close()
