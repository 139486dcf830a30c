"""`sluice bench sim` sets our runs beside the published Pollux/Optimus/Tiresias results over the
same workloads: a run on workload 3 alone was compared with the published mean of all eight."""

from __future__ import annotations

import json
from pathlib import Path

from sluice.bench.sim import published

AVGS = {f"workload-{w}": 1000.0 * w for w in range(1, 9)}  # w1 1000 s ... w8 8000 s


def _summary(base: Path, name: str, avgs: dict[str, float]) -> None:
    folder = base / "results-jobload" / name
    folder.mkdir(parents=True)
    mean = sum(avgs.values()) / len(avgs) if len(avgs) == 8 else 4500.0
    (folder / "summary.json").write_text(json.dumps({"mean": mean, "avgs": avgs}))


def test_published_is_the_mean_over_the_workloads_run(tmp_path: Path) -> None:
    _summary(tmp_path, "pollux-1.0", AVGS)
    assert published(tmp_path) == {"pollux": {"1.0": 4500.0}}
    assert published(tmp_path, list(range(1, 9))) == {"pollux": {"1.0": 4500.0}}
    assert published(tmp_path, [3]) == {"pollux": {"1.0": 3000.0}}  # was 4500: the mean of all eight
    assert published(tmp_path, [1, 5]) == {"pollux": {"1.0": 3000.0}}


def test_a_summary_without_the_workloads_run_is_left_out(tmp_path: Path) -> None:
    _summary(tmp_path, "tiresias-0.5", {"workload-1": 1000.0})
    assert published(tmp_path, [3]) == {}
    assert published(tmp_path, [1]) == {"tiresias": {"0.5": 1000.0}}
