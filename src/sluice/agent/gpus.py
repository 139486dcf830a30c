"""Which GPUs this machine may hand out to jobs.

`CUDA_VISIBLE_DEVICES`, when the plane is started with it, decides: an operator keeps GPUs
for other work that way, and `CUDA_VISIBLE_DEVICES=` (empty) hands out none. Unset, the
machine's own GPUs are found through `nvidia-smi -L` (it comes with the driver) or, where it
is missing, NVML (the `nvidia-ml-py` bindings, if installed). Before, an unset variable meant
no GPUs at all, so on a GPU box every job asking for one was refused as one that no node could
ever hold.

A GPU split into MIG instances is handed out per instance (its `MIG-...` UUID): CUDA shows a
process only the first instance of a GPU named by index. A GPU in MIG mode with no instances
is left out, saying so: CUDA shows a job given it no device at all, and `nvidia-smi -L` lists
it exactly like a GPU without MIG, so its mode is asked separately.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMI_TIMEOUT_S = 10.0
"""How long `nvidia-smi -L` may take (seconds) before the machine counts as having no GPUs:
a wedged driver can hang it, and the plane must still start."""

MIG_QUERY = ("--query-gpu=index,mig.mode.current", "--format=csv,noheader")
"""nvidia-smi's arguments for each GPU's MIG mode now ("0, Enabled"; "[N/A]" where the GPU has
no MIG): `-L` lists a MIG-mode GPU without instances like any other GPU."""

MIG_NO_INSTANCES = "MIG mode is on and it has no MIG instances: CUDA would show a job given it no device"
"""Why such a GPU is left out (the log line and what `sluice up` prints)."""

_SAYS_NONE = ("no nvidia-smi", "Ray counts none")  # sources that are themselves the reason for none
_GPU_LINE = re.compile(r"^GPU (\d+):")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class GpuDiscovery:
    """The ids to put in a job's CUDA_VISIBLE_DEVICES, and where they came from (for the log
    line that tells an operator why a GPU box offers none), and the GPUs found but not handed
    out, each with why."""

    ids: list[str]
    source: str
    left_out: tuple[str, ...] = ()

    def summary(self) -> str:
        """The line `sluice up` prints and the plane logs: what is handed out, from where, and
        what is not (a GPU box offering fewer GPUs than it has says why)."""
        # A source that is itself why there are none is said alone: "found with" it read
        # "none (found with none found (no nvidia-smi, no NVML))".
        where = self.source if not self.ids and self.source.startswith(_SAYS_NONE) else f"found with {self.source}"
        line = f"GPUs to hand out: {','.join(self.ids) or 'none'} ({where})"
        if self.left_out:
            line += "; left out: " + "; ".join(self.left_out)
        return line


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


def _smi_gpus(text: str) -> list[tuple[str, list[str]]]:
    """Each GPU `nvidia-smi -L` lists: its index and its MIG instances' UUIDs (none without)."""
    gpus: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            gpus.append((gpu.group(1), []))
            continue
        mig = _MIG_LINE.match(line)
        if mig and gpus:
            gpus[-1][1].append(mig.group(1))
    return gpus


def hand_out(gpus: list[tuple[str, list[str]]], mig_on: Collection[str]) -> tuple[list[str], tuple[str, ...]]:
    """The ids to hand out — a GPU's index, or its MIG instances' UUIDs when it has any — and
    the GPUs left out with why: one whose MIG mode is on (its index in `mig_on`) without
    instances."""
    ids: list[str] = []
    left_out: list[str] = []
    for index, migs in gpus:
        if migs:
            ids.extend(migs)
        elif index in mig_on:
            left_out.append(f"GPU {index} ({MIG_NO_INSTANCES})")
        else:
            ids.append(index)
    return ids, tuple(left_out)


def parse_smi_list(text: str, mig_on: Collection[str] = ()) -> list[str]:
    """GPU ids from `nvidia-smi -L`: a GPU's index, or its MIG instances' UUIDs when it has
    any; a GPU whose index is in `mig_on` (MIG mode on) and that has none is left out."""
    return hand_out(_smi_gpus(text), mig_on)[0]


def parse_mig_modes(text: str) -> set[str]:
    """Indices of the GPUs whose MIG mode is on now, from nvidia-smi's MIG_QUERY output
    ("0, Enabled" per line). A line it cannot read counts as MIG off: the GPU stays handed out,
    as before this was asked."""
    on: set[str] = set()
    for line in text.splitlines():
        index, _, mode = line.partition(",")
        if index.strip().isdigit() and mode.strip().lower() == "enabled":
            on.add(index.strip())
    return on


def _nvml_migs(pynvml: Any, handle: Any) -> list[str] | None:
    """The MIG instances' UUIDs of a GPU in MIG mode, or None where its MIG mode is off (or
    not there to ask: a GPU without MIG, bindings without the call)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # NVMLError_NotSupported on a GPU without MIG; older bindings lack the call
        return None
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    try:
        slots = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:  # cannot tell its instances: handed out by index, as before MIG was asked
        return None
    uuids: list[str] = []
    for slot in range(slots):
        try:
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
        except Exception:  # NVMLError_NotFound: no instance in this slot
            continue
        uuids.append(uuid.decode() if isinstance(uuid, bytes) else str(uuid))
    return uuids


def _from_nvml() -> GpuDiscovery | None:
    """The GPUs NVML counts, handed out as `nvidia-smi -L` would be (MIG instances by UUID, a
    MIG-mode GPU without instances left out), or None where the bindings or the driver are
    missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            gpus: list[tuple[str, list[str]]] = []
            mig_on: set[str] = set()
            for i in range(pynvml.nvmlDeviceGetCount()):
                migs = _nvml_migs(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i))
                if migs is not None:
                    mig_on.add(str(i))
                gpus.append((str(i), migs or []))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no bindings, no driver
        return None
    ids, left_out = hand_out(gpus, mig_on)
    return GpuDiscovery(ids, "NVML", left_out)


def _run_smi(path: str, *args: str) -> subprocess.CompletedProcess[str] | str:
    """nvidia-smi's answer, or why there is none (it failed to start, timed out or exited
    non-zero)."""
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if out.returncode != 0:
        return f"exited {out.returncode}: {out.stderr.strip() or out.stdout.strip()}"
    return out


def _from_smi(smi: str) -> GpuDiscovery | None:
    """GPU ids from `nvidia-smi -L`, less the MIG-mode GPUs without instances, or None where it
    is missing or fails. Where the MIG modes cannot be read, every GPU `-L` listed is handed
    out, as before they were asked: a query that fails must not cost the machine its GPUs."""
    path = shutil.which(smi)
    if path is None:
        return None
    listed = _run_smi(path, "-L")
    if isinstance(listed, str):
        log.warning("nvidia-smi -L failed (%s): this machine offers no GPUs", listed)
        return None
    gpus = _smi_gpus(listed.stdout)
    mig_on: set[str] = set()
    if any(not migs for _, migs in gpus):  # only a GPU without instances can be one to leave out
        modes = _run_smi(path, *MIG_QUERY)
        if isinstance(modes, str):
            log.warning("nvidia-smi could not say which GPUs are in MIG mode (%s): handing out all it listed", modes)
        else:
            mig_on = parse_mig_modes(modes.stdout)
    ids, left_out = hand_out(gpus, mig_on)
    for why in left_out:
        log.warning("not handing out %s", why)
    return GpuDiscovery(ids, "nvidia-smi -L", left_out)


def process_env(pid: int) -> dict[str, str] | None:
    """The environment process `pid` was started with (/proc/<pid>/environ), or None where it
    cannot be read (gone, another user's, no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def ray_node_gpus(count: int, raylet_env: Mapping[str, str]) -> GpuDiscovery:
    """The ids of the `count` GPUs Ray counts on a node, as Ray itself maps them: its GPU slot i
    is the raylet's CUDA_VISIBLE_DEVICES[i] where the raylet was started with one (`ray start`
    under CUDA_VISIBLE_DEVICES=2,3: GPUs 2 and 3, what `ray.get_gpu_ids()` tells a Ray task
    holding them), else i. `raylet_env` is the raylet's environment, not the agent's: Ray may
    have emptied the agent actor's own CUDA_VISIBLE_DEVICES, since it holds no GPU of Ray's
    (older Ray releases always did; newer ones where RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1)."""
    if count <= 0:
        return GpuDiscovery([], "Ray counts none on this node")
    named = from_env(raylet_env)
    if named is None:
        return GpuDiscovery([str(i) for i in range(count)], "Ray's count, the raylet having no CUDA_VISIBLE_DEVICES")
    # Ray refuses to start a raylet counting more GPUs than its CUDA_VISIBLE_DEVICES names; an
    # entry CUDA cannot read ends the list as it ends CUDA's.
    left_out = tuple(
        f"Ray's GPU {i} (the raylet's CUDA_VISIBLE_DEVICES names no GPU for it)" for i in range(len(named), count)
    )
    return GpuDiscovery(named[:count], "the raylet's CUDA_VISIBLE_DEVICES", left_out)


def discover_gpus(env: Mapping[str, str] | None = None, smi: str = "nvidia-smi") -> GpuDiscovery:
    """The GPUs this machine may hand out, and how they were found."""
    named = from_env(os.environ if env is None else env)
    if named is not None:
        return GpuDiscovery(named, "CUDA_VISIBLE_DEVICES")
    listed = _from_smi(smi)
    if listed is not None:
        return listed
    counted = _from_nvml()
    if counted is not None:
        for why in counted.left_out:
            log.warning("not handing out %s", why)
        return counted
    return GpuDiscovery([], "no nvidia-smi and no NVML on this machine")
