"""`elastic()`: the batch size and learning-rate scale for this replica at this world size.

A policy may restart a data-parallel job at another number of replicas (elastic resize).
The job must then split its work differently, and how is the spec's choice
(`resources.replicas.batch`):

- `keep_global` (default): the global batch stays `global_batch`; each replica takes its
  share (the first `global_batch % world` ranks one sample more), and the learning rate
  stays (scale 1.0). The training run is the same run at any size, only faster or slower.
- `scale`: each replica keeps `global_batch / min` samples a step, so the global batch grows
  with the replicas; the learning rate scales linearly with it (`world / min`, the linear
  scaling rule), the usual way to keep such a run converging.

Everything comes from the environment: WORLD_SIZE and RANK (torchrun's, set by the engine
for a gang; absent for one process), and SLUICE_BATCH_MODE, SLUICE_REPLICAS_MIN,
SLUICE_GLOBAL_BATCH (the spec's, set by the node agent). Run by hand, it is one replica
with the batch the script passes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MODES = ("keep_global", "scale")


@dataclass(frozen=True, slots=True)
class Elastic:
    """What one replica needs to know to train at the current world size."""

    world_size: int
    rank: int
    batch: int
    """This replica's batch a step."""
    global_batch: int
    """The batch of one step over every replica (the sum of their `batch`)."""
    lr_scale: float
    """Multiply the learning rate tuned for `global_batch` at `min` replicas by this."""
    mode: str


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < 0 or (value == 0 and name != "RANK"):
        raise ValueError(f"{name}={raw!r} is out of range")
    return value


def elastic(global_batch: int | None = None) -> Elastic:
    """This replica's batch and learning-rate scale. `global_batch` is the script's own
    default (the global batch at `min` replicas); the spec's `global_batch` wins over it."""
    world = _int_env("WORLD_SIZE", 1)
    rank = _int_env("RANK", 0)
    if rank >= world:
        raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world}")
    mode = os.environ.get("SLUICE_BATCH_MODE", "").strip() or "keep_global"
    if mode not in MODES:
        raise ValueError(f"SLUICE_BATCH_MODE={mode!r}: expected one of {', '.join(MODES)}")
    base = _int_env("SLUICE_GLOBAL_BATCH", global_batch or 0)
    if base <= 0:
        raise ValueError(
            "no global batch: set resources.replicas.global_batch in the spec or pass elastic(global_batch=N)"
        )
    if mode == "scale":
        lo = _int_env("SLUICE_REPLICAS_MIN", 1)
        per = max(1, base // lo)
        return Elastic(world, rank, per, per * world, world / lo, mode)
    if base < world:
        raise ValueError(f"global batch {base} cannot be split over {world} replicas (keep_global)")
    per = base // world + (1 if rank < base % world else 0)
    return Elastic(world, rank, per, base, 1.0, mode)
