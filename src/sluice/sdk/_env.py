"""The SDK's view of its environment, with defaults for scripts run by hand."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_RUN_DIR = "sluice-run"


@dataclass(frozen=True, slots=True)
class RunContext:
    job_id: str
    attempt: int
    run_dir: Path
    checkpoint_dir: str
    checkpoint_interval_s: float
    checkpoint_keep: int

    @property
    def under_sluice(self) -> bool:
        return "SLUICE_RUN_DIR" in os.environ


def _num(name: str, default: float, cast: type[int] | type[float]) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def context() -> RunContext:
    """Read on every call (a few dict lookups): tests and notebooks may change the variables."""
    run_dir = Path(os.environ.get("SLUICE_RUN_DIR") or Path.cwd() / DEFAULT_RUN_DIR)
    return RunContext(
        job_id=os.environ.get("SLUICE_JOB_ID", "local"),
        attempt=int(_num("SLUICE_ATTEMPT", 1, int)),
        run_dir=run_dir,
        checkpoint_dir=os.environ.get("SLUICE_CHECKPOINT_DIR") or str(run_dir / "checkpoints"),
        checkpoint_interval_s=float(_num("SLUICE_CHECKPOINT_INTERVAL_S", 30.0, float)),
        checkpoint_keep=max(1, int(_num("SLUICE_CHECKPOINT_KEEP", 2, int))),
    )
