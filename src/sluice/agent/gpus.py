"""Which GPUs this machine may hand out to jobs.

`CUDA_VISIBLE_DEVICES`, when the plane is started with it, decides: an operator keeps GPUs
for other work that way, and `CUDA_VISIBLE_DEVICES=` (empty) hands out none. Unset, the
machine's own GPUs are found through `nvidia-smi -L` (it comes with the driver) or, where it
is missing, NVML (the `nvidia-ml-py` bindings, if installed). Before, an unset variable meant
no GPUs at all, so on a GPU box every job asking for one was refused as one that no node could
ever hold.

A GPU split into MIG instances is handed out per instance (its `MIG-...` UUID): CUDA shows a
process only the first instance of a GPU named by index.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 10.0
"""How long `nvidia-smi -L` may take (seconds) before the machine counts as having no GPUs:
a wedged driver can hang it, and the plane must still start."""

_GPU_LINE = re.compile(r"^GPU (\d+):")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class GpuDiscovery:
    """The ids to put in a job's CUDA_VISIBLE_DEVICES, and where they came from (for the log
    line that tells an operator why a GPU box offers none)."""

    ids: list[str]
    source: str


def from_env(env: Mapping[str, str]) -> list[str] | None:
    """The ids CUDA_VISIBLE_DEVICES names, or None when it is unset. `-1` or an empty value
    hands out none, as CUDA reads them."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if not part or part == "-1":
            break  # CUDA stops at the first invalid entry: the ones after it are not visible
        if part not in ids:  # "0,0" is one GPU: handed out twice, two jobs would share it
            ids.append(part)
    return ids


def parse_smi_list(text: str) -> list[str]:
    """GPU ids from `nvidia-smi -L`: a GPU's index, or its MIG instances' UUIDs when it has
    any."""
    ids: list[str] = []
    current: str | None = None
    migs: list[str] = []

    def close() -> None:
        if current is not None:
            ids.extend(migs or [current])

    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            close()
            current, migs = gpu.group(1), []
            continue
        mig = _MIG_LINE.match(line)
        if mig and current is not None:
            migs.append(mig.group(1))
    close()
    return ids


def _from_nvml() -> list[str] | None:
    """GPU indices NVML counts (no MIG instances), or None where the bindings or the driver
    are missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no bindings, no driver
        return None


def _from_smi(smi: str) -> list[str] | None:
    """GPU ids from `nvidia-smi -L`, or None where it is missing or fails."""
    path = shutil.which(smi)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("nvidia-smi -L failed (%s): this machine offers no GPUs", err)
        return None
    if out.returncode != 0:
        log.warning("nvidia-smi -L exited %d (%s): this machine offers no GPUs", out.returncode, out.stderr.strip())
        return None
    return parse_smi_list(out.stdout)


def discover_gpus(env: Mapping[str, str] | None = None, smi: str = "nvidia-smi") -> GpuDiscovery:
    """The GPUs this machine may hand out, and how they were found."""
    named = from_env(os.environ if env is None else env)
    if named is not None:
        return GpuDiscovery(named, "CUDA_VISIBLE_DEVICES")
    listed = _from_smi(smi)
    if listed is not None:
        return GpuDiscovery(listed, "nvidia-smi -L")
    counted = _from_nvml()
    if counted is not None:
        return GpuDiscovery(counted, "NVML")
    return GpuDiscovery([], "none found (no nvidia-smi, no NVML)")
