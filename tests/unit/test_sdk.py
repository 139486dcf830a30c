"""sluice.sdk off-cluster defaults, progress lines, checkpoint atomicity/rotation, stop flag."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

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


def _run_in_a_job(code: str, run_dir: Path) -> str:
    """`code` in a fresh interpreter that looks like a sluice job (SLUICE_RUN_DIR set): its stdout."""
    env = {**os.environ, "SLUICE_RUN_DIR": str(run_dir)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_should_stop_after_sigterm_and_import_stays_light(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys\n"
        "from sluice import sdk\n"
        "print('torch' in sys.modules, sdk.should_stop())\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(sdk.should_stop())\n"
    )
    assert _run_in_a_job(code, tmp_path).split() == ["False", "False", "True"]


def test_a_sigterm_handler_the_job_set_before_importing_the_sdk_still_runs(tmp_path: Path) -> None:
    """Under sluice, importing the SDK replaced the job's own SIGTERM handler without a word
    (a framework's, a script's that flushes its logs): it never ran again (sdkwalk, s32). The
    SDK's handler now calls it after setting its flag."""
    code = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda s, f: print('own handler'))\n"
        "from sluice import sdk\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(sdk.should_stop())\n"
    )
    assert _run_in_a_job(code, tmp_path).splitlines() == ["own handler", "True"]


# ---------------------------------------------------------------- elastic (issue 12)

ELASTIC_VARS = ("WORLD_SIZE", "RANK", "SLUICE_BATCH_MODE", "SLUICE_REPLICAS_MIN", "SLUICE_GLOBAL_BATCH")


def _elastic_env(monkeypatch: pytest.MonkeyPatch, **env: object) -> None:
    for name in ELASTIC_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))


def test_elastic_by_hand_is_one_replica_with_the_scripts_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    _elastic_env(monkeypatch)
    assert sdk.elastic(global_batch=128) == sdk.Elastic(1, 0, 128, 128, 1.0, "keep_global")


def test_keep_global_splits_the_same_global_batch_at_every_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    for world in (1, 2, 3, 4):
        shares = []
        for rank in range(world):
            _elastic_env(monkeypatch, WORLD_SIZE=world, RANK=rank, SLUICE_BATCH_MODE="keep_global")
            el = sdk.elastic(global_batch=10)
            assert el.global_batch == 10 and el.lr_scale == 1.0 and el.world_size == world
            shares.append(el.batch)
        assert sum(shares) == 10 and max(shares) - min(shares) <= 1, shares


def test_the_specs_global_batch_wins_over_the_scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    _elastic_env(monkeypatch, WORLD_SIZE=2, RANK=1, SLUICE_GLOBAL_BATCH=64)
    assert sdk.elastic(global_batch=128).batch == 32


def test_scale_keeps_each_replicas_batch_and_scales_the_learning_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    for world, lr_scale in ((2, 1.0), (1, 0.5), (4, 2.0)):
        _elastic_env(
            monkeypatch, WORLD_SIZE=world, RANK=0, SLUICE_BATCH_MODE="scale", SLUICE_REPLICAS_MIN=2,
            SLUICE_GLOBAL_BATCH=128,
        )  # fmt: skip
        el = sdk.elastic()
        assert (el.batch, el.global_batch, el.lr_scale) == (64, 64 * world, lr_scale)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "no global batch"),
        ({"WORLD_SIZE": 4, "RANK": 0, "SLUICE_GLOBAL_BATCH": 3}, "cannot be split over 4 replicas"),
        ({"WORLD_SIZE": 2, "RANK": 2, "SLUICE_GLOBAL_BATCH": 8}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"SLUICE_BATCH_MODE": "keep", "SLUICE_GLOBAL_BATCH": 8}, "SLUICE_BATCH_MODE='keep'"),
        ({"WORLD_SIZE": "two", "SLUICE_GLOBAL_BATCH": 8}, "WORLD_SIZE='two' is not an integer"),
    ],
)
def test_elastic_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch, env: dict[str, object], message: str) -> None:
    _elastic_env(monkeypatch, **env)
    with pytest.raises(ValueError, match=re.escape(message)):
        sdk.elastic()


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda: sdk.report(2.9, loss=1.0), TypeError, "step must be a whole number"),
        (lambda: sdk.report(3, loss="abc"), TypeError, "loss must be a number, got str 'abc'"),
        (lambda: sdk.report(4, accuracy="high"), TypeError, "accuracy must be a number"),
        (lambda: sdk.report(5, total_steps=0), ValueError, "total_steps must be at least 1"),
        (lambda: sdk.report(5, total_steps=-5), ValueError, "total_steps must be at least 1"),
        # what the node agent drops or cuts without a word (sdkwalk, s32)
        (lambda: sdk.report(-1, loss=1.0), ValueError, r"step -1 is out of range: a step is 0 to 2\*\*53"),
        (lambda: sdk.report(2**53 + 1, loss=1.0), ValueError, "step 9007199254740993 is out of range"),
        (lambda: sdk.report(True, loss=1.0), TypeError, "step must be a whole number, got bool"),
        (lambda: sdk.report(5, total_steps=2.5), ValueError, "total_steps must be a whole number up to"),
        (lambda: sdk.report(5, total_steps=2**60), ValueError, "total_steps must be a whole number up to"),
        (
            lambda: sdk.report(5, **{f"m{i}": 1 for i in range(257)}),
            ValueError,
            "257 metrics; a report carries at most 256",
        ),
        (
            lambda: sdk.report(5, **{"x" * 257: 1}),
            ValueError,
            "metric name 'xxx.*' [(]257 characters[)] must be 1 to 256",
        ),
        (lambda: sdk.report(5, **{"": 1}), ValueError, "metric name '' [(]0 characters[)] must be 1 to 256"),
    ],
)
def test_report_refuses_what_it_would_have_coerced_or_dropped(
    offline: Path, call: Any, error: type[Exception], says: str
) -> None:
    """2.9 was recorded as step 2, a string loss as null, a text metric dropped, total_steps 0
    kept (walk5); nothing is written for a refused report."""
    with pytest.raises(error, match=says):
        call()
    progress = offline / "sluice-run" / "progress.jsonl"
    assert not progress.exists()
    sdk.report(6.0, loss=float("nan"), total_steps=10, accuracy=0.5)  # a whole float, a diverged loss: fine
    line = json.loads(progress.read_text().splitlines()[-1])
    assert (line["step"], line["loss"], line["metrics"]) == (6, None, {"total_steps": 10.0, "accuracy": 0.5})


def test_a_loss_that_requires_grad_is_reported_without_a_warning(offline: Path) -> None:
    """`sdk.report(step, loss=loss)` with the loss straight from the graph (what a training
    loop has) printed torch's 'Converting a tensor with requires_grad=True to a scalar'
    warning into every job's log (sdkwalk, s32)."""
    torch = pytest.importorskip("torch")
    loss = (torch.ones(3, requires_grad=True) * 2).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sdk.report(1, loss=loss, accuracy=torch.tensor(0.5, requires_grad=True))
    line = _lines(offline / "sluice-run" / "progress.jsonl")[-1]
    assert (line["loss"], line["metrics"]) == (6.0, {"accuracy": 0.5})


def test_an_int_past_floats_range_is_infinite_not_an_overflow(offline: Path) -> None:
    """`report(1, loss=10**400)` raised a bare OverflowError naming neither the loss nor the
    SDK; an int too large for a float is infinite, and is recorded as null like inf."""
    sdk.report(1, loss=10**400, accuracy=-(10**400), total_steps=10)
    line = _lines(offline / "sluice-run" / "progress.jsonl")[-1]
    assert (line["loss"], line["metrics"]) == (None, {"total_steps": 10.0})


def test_the_sdks_report_limits_are_the_agents() -> None:
    """The SDK refuses a report the agent would drop or cut (sdk cannot import the agent)."""
    from sluice.agent import progress_record
    from sluice.model.progress import MAX_STEP
    from sluice.sdk import _progress

    assert _progress.MAX_STEP == MAX_STEP
    assert _progress.MAX_METRICS == progress_record.MAX_METRICS
    assert _progress.MAX_METRIC_NAME == progress_record.MAX_METRIC_NAME


def test_the_largest_step_and_most_metrics_are_kept(offline: Path) -> None:
    sdk.report(2**53, loss=1.0, total_steps=2**53, **{f"m{i}": 1 for i in range(255)})
    sdk.report(0, **{"x" * 256: 1})
    first, second = _lines(offline / "sluice-run" / "progress.jsonl")
    assert (first["step"], len(first["metrics"]), second["step"]) == (2**53, 256, 0)


def test_too_many_metrics_names_those_the_dataset_reader_added(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job reading datasets gets stall_s, data_bytes and 3 cache counters per dataset added
    to each report. A job that passed 254 metrics while reading 2 datasets was told it passed
    262, with no word of where the other 8 came from (redteam32, s32)."""
    import types

    added = {"stall_s": 0.0, "data_bytes": 1.0}
    added |= {f"cache:alice/d{i}:{w}": 0.0 for i in range(2) for w in ("hits_memory", "hits_disk", "misses")}
    fake = types.SimpleNamespace(data_metrics=lambda: dict(added), CACHE_METRIC="cache:")
    monkeypatch.setitem(sys.modules, "sluice.sdk.dataset", fake)
    with pytest.raises(ValueError, match=r"257 metrics \(2 added by sluice.sdk.dataset: stall_s, data_bytes and 3"):
        sdk.report(1, **{f"m{i}": 1 for i in range(255)})
    sdk.report(1, **{f"m{i}": 1 for i in range(248)})  # 256 with those added: kept
    sdk.report(2, **{f"m{i}": 1 for i in range(250)})  # the counters of one dataset are left out
    *_, whole, cut = _lines(offline / "sluice-run" / "progress.jsonl")
    assert len(whole["metrics"]) == 256 and len(cut["metrics"]) == 255
    assert sorted(k for k in cut["metrics"] if k.startswith("cache:")) == [
        "cache:alice/d0:hits_disk",
        "cache:alice/d0:hits_memory",
        "cache:alice/d0:misses",
    ]


def test_a_job_reading_many_datasets_can_still_report(offline: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3 cache counters per dataset: a job with 85 datasets open had 257 metrics before it
    reported any of its own, and every report() raised (red team s32). The SDK's counters are
    now left out past the cap, by whole datasets; the job's own metrics are all kept."""
    import types

    added = {"stall_s": 0.0, "data_bytes": 1.0}
    added |= {f"cache:alice/d{i:03d}:{w}": 0.0 for i in range(100) for w in ("hits_memory", "hits_disk", "misses")}
    fake = types.SimpleNamespace(data_metrics=lambda: dict(added), CACHE_METRIC="cache:")
    monkeypatch.setitem(sys.modules, "sluice.sdk.dataset", fake)
    sdk.report(1, loss=0.5, accuracy=0.9)
    (line,) = _lines(offline / "sluice-run" / "progress.jsonl")
    assert line["metrics"]["accuracy"] == 0.9 and len(line["metrics"]) == 255  # 1 + 2 + 84 datasets x 3
