"""sdk.checkpoint.save with a negative step is a ValueError (walk5): it wrote
ckpt--00000000001.pt, which load(), latest_step() and the rotation never see, so the state
was silently lost."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from sluice import sdk


@pytest.fixture(autouse=True)
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("SLUICE_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    return tmp_path


def test_a_negative_step_is_refused_and_writes_nothing(run_dir: Path) -> None:
    with pytest.raises(ValueError, match="step -1"):
        sdk.checkpoint.save({"a": 1}, step=-1)
    assert not (run_dir / "ckpt").exists() or not list((run_dir / "ckpt").iterdir())


def test_step_zero_is_saved_and_loaded() -> None:
    sdk.checkpoint.save({"a": 1}, step=0)
    assert sdk.checkpoint.load() == {"a": 1}
    assert sdk.checkpoint.latest_step() == 0


@pytest.mark.parametrize(
    ("step", "error", "says"),
    [
        (2.9, TypeError, "step must be a whole number, got float '2.9'"),
        ("7", TypeError, "step must be a whole number, got str '7'"),
        (True, TypeError, "step must be a whole number, got bool"),
        (2**53 + 1, ValueError, "step 9007199254740993 is out of range"),
    ],
)
def test_a_step_report_would_refuse_is_refused_and_writes_nothing(
    run_dir: Path, step: object, error: type[Exception], says: str
) -> None:
    """int() made 2.9, "7" and True steps 2, 7 and 1; a step past 2**53 was saved, and the
    agent dropped its record, so the plane never learnt of it (sdkwalk, s32)."""
    with pytest.raises(error, match=says):
        sdk.checkpoint.save({"a": 1}, step=step)  # type: ignore[arg-type]
    assert not (run_dir / "ckpt").exists() or not list((run_dir / "ckpt").iterdir())


def test_a_whole_float_step_is_saved_as_an_int() -> None:
    assert sdk.checkpoint.save({"a": 1}, step=3.0).endswith("ckpt-000000000003.pt")  # type: ignore[arg-type]
    assert sdk.checkpoint.latest_step() == 3


def test_two_threads_saving_one_step_at_once_both_finish(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file was named by the process only: two threads saving the same step at
    once (a save on a signal thread and one in the loop) wrote one file, and the second rename
    failed with FileNotFoundError (sdkwalk, s32). Each now writes its own."""
    torch = pytest.importorskip("torch")
    real = torch.save
    both = threading.Barrier(2, timeout=10)

    def slow_save(obj: object, f: Any) -> None:
        buf = io.BytesIO()
        real(obj, buf)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        both.wait()  # both threads are half-way through their file
        f.write(data[len(data) // 2 :])

    monkeypatch.setattr(torch, "save", slow_save)
    errors: list[BaseException] = []

    def save(value: int) -> None:
        try:
            sdk.checkpoint.save({"who": value}, step=5)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=save, args=(v,)) for v in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sdk.checkpoint.load() in ({"who": 1}, {"who": 2})
    assert [p.name for p in (run_dir / "ckpt").iterdir()] == ["ckpt-000000000005.pt"]


def test_a_checkpoint_the_safe_loader_refuses_is_named_not_skipped() -> None:
    """A state holding a numpy array (a metric buffer, numpy's RNG state) is refused by torch's
    weights_only loader. load() took that for a torn file and fell back to older checkpoints,
    refused too, then returned None: every resume started again from step 0, with only a
    warning in the log (sdkwalk, s32)."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("torch")
    sdk.checkpoint.save({"step": 1, "buf": np.zeros(3)}, step=1)
    sdk.checkpoint.save({"step": 2, "buf": np.ones(3)}, step=2)
    with pytest.raises(RuntimeError, match=r"ckpt-000000000002.pt \(step 2\) holds something .*weights_only=False"):
        sdk.checkpoint.load()
    state = sdk.checkpoint.load(weights_only=False)
    assert state is not None and state["step"] == 2


def test_a_torn_checkpoint_is_still_skipped_for_the_one_before(run_dir: Path) -> None:
    pytest.importorskip("torch")
    sdk.checkpoint.save({"step": 1}, step=1)
    path = Path(sdk.checkpoint.save({"step": 2}, step=2))
    path.write_bytes(path.read_bytes()[:-10])
    assert sdk.checkpoint.load() == {"step": 1}


@pytest.mark.parametrize("state", [(1, 2), [1], "model"])
def test_a_state_load_would_not_return_is_refused(run_dir: Path, state: object) -> None:
    """load() returns a dict or None: a tuple state was saved, then read back as None, a fresh
    start, without a word (sdkwalk, s32)."""
    with pytest.raises(TypeError, match=f"state must be a dict .*got {type(state).__name__}"):
        sdk.checkpoint.save(state, step=1)  # type: ignore[arg-type]
    assert not (run_dir / "ckpt").exists() or not list((run_dir / "ckpt").iterdir())


def test_a_file_named_past_the_largest_step_is_no_checkpoint(run_dir: Path) -> None:
    """ckpt-<30 digits>.pt (no step save() writes) was the newest checkpoint for load() and
    latest_step(), and never rotated away (sdkwalk, s32)."""
    pytest.importorskip("torch")
    sdk.checkpoint.save({"a": 1}, step=12)
    for name in ("ckpt-" + "9" * 30 + ".pt", f"ckpt-{2**53 + 1}.pt"):
        (run_dir / "ckpt" / name).write_bytes(b"junk")
    assert sdk.checkpoint.latest_step() == 12
    assert sdk.checkpoint.load() == {"a": 1}


def test_a_damaged_newest_checkpoint_the_safe_loader_refuses_falls_back_to_an_older_one(run_dir: Path) -> None:
    """A flipped byte in a checkpoint's pickle often reads, to torch's safe loader, as a name it
    does not allow ('Unsupported global'). load() raised for it, so one damaged file stopped
    every resume although the checkpoint before it was whole (redteam32, s32). Only when no
    older checkpoint loads is the refusal raised."""
    pytest.importorskip("torch")
    import torch

    sdk.checkpoint.save({"step": 1, "w": torch.ones(2)}, step=1)
    path = Path(sdk.checkpoint.save({"step": 2, "w": torch.ones(2)}, step=2))
    data = path.read_bytes()
    assert b"_rebuild_tensor_v2" in data
    path.write_bytes(data.replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_vX"))  # same length, zip intact
    state = sdk.checkpoint.load()
    assert state is not None and state["step"] == 1
