"""Keep each job off the GPUs it was not given, in the kernel.

`CUDA_VISIBLE_DEVICES` only tells CUDA which GPUs to show. The driver makes every
`/dev/nvidiaN` readable and writable by every uid, so without more a hostile job (one that
asked for no GPU too) could open any GPU of its machine, fill its memory and read what the
other tenant's kernels leave there. The fence is the device cgroup, as Slurm's
`ConstrainDevices` does it:

- cgroup v1 `devices` controller: each attempt gets a group of its own with a
  `devices.deny` line per device it may not open;
- cgroup v2 has no such controller: the kernel asks the eBPF device programs attached to the
  process's cgroup, and a small one (agent/bpf_device.py) is attached to the attempt's own
  v2 group.

A job with no GPU is refused every character device of the NVIDIA driver (the GPUs,
`nvidiactl`, UVM, MIG capabilities: every major /proc/devices names `nvidia*`, and 195); a
job with GPUs is refused the other GPUs' `/dev/nvidiaN`. The shim enters the fence before the
job starts and refuses to start it when it cannot (`--fence`), and a tenant's uid cannot
write the cgroup files to leave it.

**Numbering.** CUDA counts only the devices a process can open, so inside the fence a job
given GPUs 1 and 3 sees them as devices 0 and 1 (Slurm documents the same for its jobs). Its
`CUDA_VISIBLE_DEVICES` is then `0,1`, and `SLUICE_GPUS` keeps the machine's ids. A GPU or MIG
UUID names its device wherever it sits and is passed unchanged.

**Which file is which GPU.** sluice's ids are nvidia-smi's indices, which count GPUs in PCI
bus order (jobs get `CUDA_DEVICE_ORDER=PCI_BUS_ID` for the same reason). The driver lists its
GPUs in `/proc/driver/nvidia/gpus/<PCI bus id>/information`, each with its UUID and device
minor (the N of `/dev/nvidiaN`, which need not be its index). A job whose GPU is not found
there is not fenced from the other GPUs (its log says so); a job with no GPU always is.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from sluice.agent import bpf_device
from sluice.agent.bpf_device import BpfUnavailable, DenyRule
from sluice.agent.cgroup import SYSFS_CGROUP, CgroupKind, CgroupLayout, _ensure_dir, _parent_under, rmdir_group
from sluice.agent.gpus import SMI_TIMEOUT_S

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
"""The NVIDIA driver's fixed character major: /dev/nvidiaN (minor N), nvidia-modeset (254),
nvidiactl (255)."""
GPU_MINORS = 254
"""The minors a GPU's /dev/nvidiaN can have: 254 and 255 are nvidia-modeset and nvidiactl."""
PROC = Path("/proc")
_GPU_SMI_LINE = re.compile(r"^GPU (\d+):")
_MIG_SMI_LINE = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as the driver lists it. `index`: its place in PCI bus order (nvidia-smi's)."""

    index: int
    bus: str
    uuid: str
    minor: int


@dataclass(frozen=True)
class GpuTable:
    """This machine's NVIDIA GPUs and character majors, read once when a node starts."""

    gpus: tuple[GpuDevice, ...] = ()
    majors: tuple[int, ...] = (NVIDIA_MAJOR,)
    """Every character major the NVIDIA driver registered (195 always; UVM, caps, ... when loaded)."""
    mig_parents: Mapping[str, int] = field(default_factory=dict)
    """A MIG instance's UUID → the index of the GPU it is a part of."""
    unreadable: int = 0
    """GPUs the driver lists whose device minor could not be read: not in `gpus`, and the
    files they may be cannot be told from the others'."""


def _information(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def nvidia_majors(devices_text: str) -> tuple[int, ...]:
    """The character majors /proc/devices names `nvidia*`, with 195 always among them."""
    majors = {NVIDIA_MAJOR}
    in_char = False
    for line in devices_text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip() == "Character devices:"
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
            majors.add(int(parts[0]))
    return tuple(sorted(majors))


def parse_mig_parents(smi_list: str) -> dict[str, int]:
    """MIG UUID → its GPU's index, from `nvidia-smi -L` (instances are listed under their GPU)."""
    parents: dict[str, int] = {}
    current: int | None = None
    for line in smi_list.splitlines():
        gpu = _GPU_SMI_LINE.match(line)
        if gpu:
            current = int(gpu.group(1))
            continue
        mig = _MIG_SMI_LINE.match(line)
        if mig and current is not None:
            parents[mig.group(1)] = current
    return parents


def _smi_list(smi: str) -> str:
    path = shutil.which(smi)
    if path is None:
        return ""
    try:
        out = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


def read_gpu_table(ids: Sequence[str] = (), proc: Path = PROC, smi: str = "nvidia-smi") -> GpuTable:
    """The driver's GPUs (PCI bus order) and majors; `nvidia-smi -L` is asked only when one of
    `ids` (the node's) is a MIG instance. Missing files read as no GPUs: nothing to fence
    them by, and the jobs that have none are still refused the majors."""
    gpus: list[GpuDevice] = []
    root = proc / "driver" / "nvidia" / "gpus"
    try:
        buses = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        buses = []
    unreadable = 0
    for index, bus in enumerate(buses):  # its place among all of them: one unread must not renumber the rest
        try:
            info = _information((bus / "information").read_text())
            minor = int(info["Device Minor"])
        except (OSError, KeyError, ValueError) as err:
            log.warning(
                "GPU %s: cannot read its device minor (%s); a job given it is not fenced, and the jobs "
                "given other GPUs are refused every other /dev/nvidiaN",
                bus.name,
                err,
            )
            unreadable += 1
            continue
        gpus.append(GpuDevice(index, bus.name, info.get("GPU UUID", ""), minor))
    try:
        majors = nvidia_majors((proc / "devices").read_text())
    except OSError:
        majors = (NVIDIA_MAJOR,)
    migs = parse_mig_parents(_smi_list(smi)) if any(i.startswith("MIG-") for i in ids) else {}
    return GpuTable(tuple(gpus), majors, migs, unreadable)


def with_current_majors(table: GpuTable, proc: Path = PROC) -> GpuTable:
    """The table with the majors the driver has registered by now added: UVM is often loaded
    by the first CUDA program, after the node started, and a job without GPUs must be
    refused it too. Read at every launch (one small file)."""
    try:
        now = nvidia_majors((proc / "devices").read_text())
    except OSError:
        return table
    merged = tuple(sorted(set(table.majors) | set(now)))
    return table if merged == table.majors else replace(table, majors=merged)


@dataclass(frozen=True)
class FencePlan:
    """What one attempt may not open, and the CUDA_VISIBLE_DEVICES it gets."""

    deny: tuple[DenyRule, ...]
    visible: tuple[str, ...]
    unfenced: str = ""
    """Why the job's GPUs are not fenced from the others ("" when they are)."""


def _resolve(table: GpuTable, gpu_id: str) -> GpuDevice | None:
    if gpu_id.isdigit():
        index = int(gpu_id)
    elif gpu_id.startswith("MIG-") and gpu_id in table.mig_parents:
        index = table.mig_parents[gpu_id]
    else:
        return next((g for g in table.gpus if g.uuid and g.uuid == gpu_id), None)
    return next((g for g in table.gpus if g.index == index), None)


def plan_fence(table: GpuTable, ids: Sequence[str]) -> FencePlan:
    """The fence for a job given GPUs `ids` (the node's ids; empty: none)."""
    if not ids:
        return FencePlan(tuple((major, None) for major in table.majors), ())
    devices: dict[str, GpuDevice] = {}
    for gpu_id in ids:
        device = _resolve(table, gpu_id)
        if device is None:
            why = f"GPU {gpu_id} is not in the driver's list (/proc/driver/nvidia/gpus)"
            return FencePlan((), tuple(ids), unfenced=why)
        devices[gpu_id] = device
    mine = {d.minor for d in devices.values()}
    # A GPU whose minor is unknown could be any /dev/nvidiaN: then every other one is refused.
    others = range(GPU_MINORS) if table.unreadable else [g.minor for g in table.gpus]
    deny = tuple((NVIDIA_MAJOR, m) for m in others if m not in mine)
    if not deny:
        return FencePlan((), tuple(ids))
    # Inside the fence CUDA counts the job's GPUs (each MIG instance's GPU once) from 0 in PCI
    # bus order: an index becomes its place there; a UUID names its device wherever it is.
    inside = sorted({d.index for d in devices.values()})
    visible = tuple(str(inside.index(devices[i].index)) if i.isdigit() else i for i in ids)
    return FencePlan(deny, visible)


class FenceKind(StrEnum):
    V1 = "the cgroup v1 devices controller"
    BPF = "a cgroup v2 device program (eBPF)"
    NONE = "none"


@dataclass(frozen=True)
class FenceSupport:
    """How this node fences its jobs' devices; `parent` holds v1 job groups, `reason` says
    why there is no fence."""

    kind: FenceKind
    parent: Path | None = None
    reason: str = ""

    @property
    def enforced(self) -> bool:
        return self.kind is not FenceKind.NONE

    def describe(self) -> str:
        if self.kind is FenceKind.NONE:
            return f"jobs are NOT fenced from the GPUs they were not given: {self.reason}"
        return f"each job is fenced from the GPUs it was not given by {self.kind}"


def detect_fence(
    layout: CgroupLayout, root: str | None, sysfs: Path = SYSFS_CGROUP, enabled: bool = True
) -> FenceSupport:
    """The v1 `devices` controller where it is mounted and writable, else a device program on
    the jobs' own v2 groups, else none (and why)."""
    if not enabled:
        return FenceSupport(FenceKind.NONE, reason="turned off (setting gpu_fence=off)")
    v1 = sysfs / "devices"
    if (v1 / "devices.deny").exists():
        parent = _parent_under(v1, root or "sluice")
        if _ensure_dir(parent):
            return FenceSupport(FenceKind.V1, parent)
    if layout.kind is CgroupKind.V2 and layout.cpu_parent is not None:
        why = bpf_device.unavailable(layout.cpu_parent)
        if why is None:
            return FenceSupport(FenceKind.BPF)
        return FenceSupport(FenceKind.NONE, reason=f"the kernel refused a cgroup v2 device program ({why})")
    if (v1 / "devices.deny").exists():
        return FenceSupport(FenceKind.NONE, reason=f"{_parent_under(v1, root or 'sluice')} is not writable")
    return FenceSupport(
        FenceKind.NONE, reason="no cgroup devices controller, and jobs have no cgroup v2 group of their own"
    )


class DeviceFence:
    """One attempt's fence. create() before the shim starts; the shim must join procs_files();
    cleanup() once the attempt has ended (a v2 program goes with the job's own group)."""

    def __init__(self, support: FenceSupport, name: str, plan: FencePlan, job_group: Path | None) -> None:
        self.support = support
        self.plan = plan
        self.dir: Path | None = None
        if support.kind is FenceKind.V1 and support.parent is not None:
            self.dir = support.parent / name
        elif support.kind is FenceKind.BPF:
            self.dir = job_group

    @property
    def active(self) -> bool:
        return bool(self.plan.deny) and self.dir is not None

    def create(self) -> tuple[str, ...]:
        """Make the fence; returns the cgroup.procs files the shim must join. Raises OSError
        (the launch fails) where the kernel refuses: never run a job believed fenced unfenced."""
        if not self.active or self.dir is None:
            return ()
        if self.support.kind is FenceKind.V1:
            self.dir.mkdir(exist_ok=True)
            deny = self.dir / "devices.deny"
            for major, minor in self.plan.deny:
                deny.write_text(f"c {major}:{'*' if minor is None else minor} rwm")
        else:
            try:
                bpf_device.attach(self.dir, self.plan.deny)
            except BpfUnavailable as err:
                raise OSError(err.errno, f"GPU fence: {err.strerror}") from None
        return (str(self.dir / "cgroup.procs"),)

    def cleanup(self) -> None:
        if self.support.kind is FenceKind.V1 and self.dir is not None:
            rmdir_group(self.dir)
