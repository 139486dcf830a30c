"""CPU job profiles: throughput against the CPU limit, and a learning curve.

Two sources: parametric families (for synthetic FlowCon/SpeCon-style workloads) and profiles
measured from the real example jobs by `sluice sim profile`, saved as JSON
(`{"cores": [...], "steps_per_s": [...], "loss_start": .., "loss_floor": .., "loss_half_steps": ..}`,
optionally with the measured start-up, `"startup_cpu_s"` and `"startup_wait_s"`).
"""

from __future__ import annotations

import json
from pathlib import Path

from sluice.sim.jobs import CpuCurve

_CORES = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0)

FAMILIES: dict[str, tuple[float, float, float, float, float]] = {
    # name: (saturation cores, steps/s at saturation, loss start, loss floor, half-loss steps)
    "mnist-cnn": (2.0, 12.0, 2.3, 0.05, 150.0),
    "cifar-resnet": (4.0, 3.0, 2.3, 0.45, 900.0),
    "lstm": (3.0, 5.0, 4.5, 1.1, 500.0),
    "mlp": (1.0, 25.0, 1.0, 0.1, 80.0),
}
"""Parametric families: near-linear speed-up up to a saturation point, then flat."""


def family_curve(name: str) -> CpuCurve:
    try:
        sat, peak, l0, lf, half = FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown CPU profile family {name!r}; choose one of {', '.join(sorted(FAMILIES))}") from None
    steps = tuple(peak * (min(c, sat) / sat) ** 0.85 for c in _CORES)
    return CpuCurve(_CORES, steps, l0, lf, half)


def load_curve(path: str | Path) -> CpuCurve:
    """A profile saved by `sluice sim profile`."""
    d = json.loads(Path(path).read_text())
    cores = tuple(float(c) for c in d["cores"])
    sps = tuple(float(s) for s in d["steps_per_s"])
    if len(cores) < 1 or len(cores) != len(sps) or list(cores) != sorted(cores):
        raise ValueError(f"{path}: 'cores' must be ascending and as long as 'steps_per_s'")
    return CpuCurve(
        cores,
        sps,
        float(d.get("loss_start", 2.5)),
        float(d.get("loss_floor", 0.2)),
        float(d.get("loss_half_steps", 200.0)),
        None if d.get("startup_cpu_s") is None else float(d["startup_cpu_s"]),
        float(d.get("startup_wait_s") or 0.0),
    )


def save_curve(curve: CpuCurve, path: str | Path, **meta: object) -> None:
    Path(path).write_text(
        json.dumps(
            {
                "cores": list(curve.cores),
                "steps_per_s": list(curve.steps_per_s),
                "loss_start": curve.loss_start,
                "loss_floor": curve.loss_floor,
                "loss_half_steps": curve.loss_half_steps,
                "startup_cpu_s": curve.startup_cpu_s,
                "startup_wait_s": curve.startup_wait_s,
                **meta,
            },
            indent=2,
        )
    )


def resolve_curve(profile: str) -> CpuCurve:
    """A family name or the path of a saved profile."""
    if profile in FAMILIES:
        return family_curve(profile)
    if Path(profile).is_file():
        return load_curve(profile)
    raise ValueError(f"CPU profile {profile!r} is neither a family ({', '.join(sorted(FAMILIES))}) nor a file")
