"""sluice.sdk off-cluster defaults, progress lines, checkpoint atomicity/rotation, stop flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice import sdk


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A script run by hand: no SLUICE_* variables, cwd in tmp_path."""
    for k in list(os.environ):
        if k.startswith("SLUICE_"):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_report_without_sluice_writes_under_sluice_run(offline: Path) -> None:
    ctx = sdk.context()
    assert ctx.job_id == "local" and ctx.attempt == 1 and not ctx.under_sluice
    assert ctx.run_dir == offline / "sluice-run"
    assert ctx.checkpoint_dir == str(offline / "sluice-run" / "checkpoints")
    sdk.report(3, loss=0.5, total_steps=10, accuracy=float("nan"), samples_per_s=12)
    sdk.report(4, loss=float("inf"))
    first, second = _lines(offline / "sluice-run" / "progress.jsonl")
    assert first["step"] == 3 and first["loss"] == 0.5
    assert first["metrics"] == {"total_steps": 10.0, "samples_per_s": 12.0}, "NaN metrics are dropped"
    assert second["loss"] is None, "a diverged loss is null, not invalid JSON"


def test_checkpoint_rotation_keeps_newest_and_records_each_save(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CHECKPOINT_KEEP", "2")
    assert sdk.checkpoint.load() is None and sdk.checkpoint.latest_step() is None
    paths = [sdk.checkpoint.save({"w": step}, step) for step in (5, 10, 15)]
    ckdir = offline / "sluice-run" / "checkpoints"
    assert sorted(os.listdir(ckdir)) == [Path(p).name for p in paths[1:]], "no temporary files left behind"
    assert sdk.checkpoint.load() == {"w": 15} and sdk.checkpoint.latest_step() == 15
    records = [r for r in _lines(offline / "sluice-run" / "progress.jsonl") if "checkpoint" in r]
    assert [(r["step"], r["checkpoint"]) for r in records] == [(5, paths[0]), (10, paths[1]), (15, paths[2])]


def test_a_torn_newest_checkpoint_falls_back_to_the_previous_one(offline: Path) -> None:
    sdk.checkpoint.save({"w": 1}, 1)
    newest = Path(sdk.checkpoint.save({"w": 2}, 2))
    newest.write_bytes(newest.read_bytes()[:20])  # what a crash in the middle of a copy leaves
    (newest.parent / ".tmp-999-ckpt-000000000003.pt").write_bytes(b"half")  # an unfinished save
    assert sdk.checkpoint.load() == {"w": 1}


def test_checkpoints_to_an_fsspec_url(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CHECKPOINT_DIR", "memory://sluice-test-ckpt/job-1")
    monkeypatch.setenv("SLUICE_CHECKPOINT_KEEP", "1")
    sdk.checkpoint.save({"w": 1}, 1)
    path = sdk.checkpoint.save({"w": 2}, 2)
    assert path == "memory:///sluice-test-ckpt/job-1/ckpt-000000000002.pt"
    assert sdk.checkpoint.load() == {"w": 2}
    import fsspec

    fs = fsspec.filesystem("memory")
    assert [p.rsplit("/", 1)[-1] for p in fs.ls("/sluice-test-ckpt/job-1", detail=False)] == ["ckpt-000000000002.pt"]
    fs.rm("/sluice-test-ckpt", recursive=True)


def test_due_follows_the_interval(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_CHECKPOINT_INTERVAL_S", "3600")
    sdk.checkpoint.save({"w": 1}, 1)
    assert not sdk.checkpoint.due()
    monkeypatch.setenv("SLUICE_CHECKPOINT_INTERVAL_S", "0")
    assert sdk.checkpoint.due()
    monkeypatch.setenv("SLUICE_CHECKPOINT_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="SLUICE_CHECKPOINT_INTERVAL_S"):
        sdk.checkpoint.due()


def test_should_stop_after_sigterm_and_import_stays_light(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys\n"
        "from sluice import sdk\n"
        "print('torch' in sys.modules, sdk.should_stop())\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(sdk.should_stop())\n"
    )
    env = {**os.environ, "SLUICE_RUN_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]
