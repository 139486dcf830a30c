"""sdk.checkpoint.save with a negative step is a ValueError (walk5): it wrote
ckpt--00000000001.pt, which load(), latest_step() and the rotation never see, so the state
was silently lost."""

from __future__ import annotations

from pathlib import Path

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
