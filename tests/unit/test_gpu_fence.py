"""The GPU fence's pure parts: reading the driver's table (from a FAKE /proc tree written
here), the plan per job, the device program's shape and how a node picks its fence. The
kernel side runs in tests/security/test_gpu_fence.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sluice.agent import bpf_device
from sluice.agent.cgroup import CgroupKind, CgroupLayout
from sluice.agent.gpu_fence import (
    NVIDIA_MAJOR,
    FenceKind,
    GpuDevice,
    GpuTable,
    detect_fence,
    nvidia_majors,
    parse_mig_parents,
    plan_fence,
    read_gpu_table,
    with_current_majors,
)
from tests.unit.test_gpus import fake_smi

DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
235 nvidia-caps
510 nvidia-nvlink
511 nvidia-uvm
254 ndctl

Block devices:
195 nvidia-not-a-char-device
259 blkext
"""


def _gpu(proc: Path, bus: str, minor: int | str, uuid: str) -> None:
    d = proc / "driver" / "nvidia" / "gpus" / bus
    d.mkdir(parents=True)
    (d / "information").write_text(
        f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\n"
        f"Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
        f"Device Minor: \t {minor}\nBus Location: \t {bus}\n"
    )


def test_the_table_lists_gpus_in_pci_bus_order_with_their_minors(tmp_path: Path) -> None:
    # Written out of order, with minors that are not the indices: the table goes by bus id.
    _gpu(tmp_path, "0000:c1:00.0", 0, "GPU-cccc")
    _gpu(tmp_path, "0000:17:00.0", 2, "GPU-aaaa")
    _gpu(tmp_path, "0000:41:00.0", 1, "GPU-bbbb")
    _gpu(tmp_path, "0000:e1:00.0", "not a number", "GPU-dddd")  # left out, said in the log
    (tmp_path / "devices").write_text(DEVICES)
    table = read_gpu_table(proc=tmp_path)
    assert table.gpus == (
        GpuDevice(0, "0000:17:00.0", "GPU-aaaa", 2),
        GpuDevice(1, "0000:41:00.0", "GPU-bbbb", 1),
        GpuDevice(2, "0000:c1:00.0", "GPU-cccc", 0),
    )
    assert table.majors == (195, 235, 510, 511) and table.unreadable == 1


def test_a_gpu_whose_minor_cannot_be_read_does_not_renumber_the_others(tmp_path: Path) -> None:
    """Red team (s21): the GPUs after an unreadable one were given the index before theirs,
    so a job given GPU 2 was fenced to GPU 3's file (another tenant's) and refused its own."""
    _gpu(tmp_path, "0000:17:00.0", 3, "GPU-aaaa")
    _gpu(tmp_path, "0000:41:00.0", "garbled", "GPU-bbbb")
    _gpu(tmp_path, "0000:81:00.0", 1, "GPU-cccc")
    _gpu(tmp_path, "0000:c1:00.0", 0, "GPU-dddd")
    table = read_gpu_table(proc=tmp_path)
    assert [(g.index, g.minor) for g in table.gpus] == [(0, 3), (2, 1), (3, 0)]
    plan = plan_fence(table, ["2"])
    # Its own file (nvidia1) is let through; every other GPU file is refused, the unread
    # GPU's (whichever it is) included, so CUDA sees the job's one GPU and counts it as 0.
    assert (NVIDIA_MAJOR, 1) not in plan.deny and (NVIDIA_MAJOR, 0) in plan.deny and (NVIDIA_MAJOR, 2) in plan.deny
    assert {m for _, m in plan.deny} == set(range(254)) - {1} and plan.visible == ("0",)
    assert plan_fence(table, ["1"]).unfenced  # the unread GPU itself: not fenced, and said


def test_a_machine_without_the_driver_has_no_gpus_and_still_the_nvidia_major(tmp_path: Path) -> None:
    assert read_gpu_table(proc=tmp_path) == GpuTable((), (NVIDIA_MAJOR,))
    assert nvidia_majors("Character devices:\n  1 mem\n") == (NVIDIA_MAJOR,)


TABLE = GpuTable(
    gpus=(
        GpuDevice(0, "0000:17:00.0", "GPU-aaaa", 2),
        GpuDevice(1, "0000:41:00.0", "GPU-bbbb", 1),
        GpuDevice(2, "0000:c1:00.0", "GPU-cccc", 0),
    ),
    majors=(195, 511),
    mig_parents={"MIG-1111": 1},
)


def test_a_job_without_gpus_is_refused_every_nvidia_device() -> None:
    plan = plan_fence(TABLE, [])
    assert plan.deny == ((195, None), (511, None)) and plan.visible == () and not plan.unfenced


def test_a_job_is_refused_the_other_gpus_and_counts_its_own_from_zero() -> None:
    plan = plan_fence(TABLE, ["0", "2"])
    assert plan.deny == ((195, 1),)  # GPU 1 is /dev/nvidia1; GPUs 0 and 2 are nvidia2, nvidia0
    assert plan.visible == ("0", "1")
    # Inside the fence CUDA counts in PCI bus order: ids in another order keep their place,
    # so CUDA_VISIBLE_DEVICES[k] and SLUICE_GPUS[k] name the same GPU.
    assert plan_fence(TABLE, ["2", "0"]).visible == ("1", "0")


def test_a_mix_of_mig_instances_and_indices_counts_the_indices_inside_the_fence() -> None:
    """Red team (s21): a job given GPU 1's MIG instance and GPU 2 kept "2" in its
    CUDA_VISIBLE_DEVICES, but inside the fence CUDA sees two GPUs (1 and 2) as 0 and 1:
    "2" named none, and CUDA stops at it (the job lost its GPU)."""
    plan = plan_fence(TABLE, ["MIG-1111", "2"])
    assert plan.deny == ((195, 2),) and plan.visible == ("MIG-1111", "1")


def test_uuids_and_mig_instances_keep_their_names_and_fence_by_their_gpu() -> None:
    assert plan_fence(TABLE, ["GPU-cccc"]).deny == ((195, 2), (195, 1))
    assert plan_fence(TABLE, ["GPU-cccc"]).visible == ("GPU-cccc",)
    mig = plan_fence(TABLE, ["MIG-1111"])
    assert mig.deny == ((195, 2), (195, 0)) and mig.visible == ("MIG-1111",)


def test_a_gpu_the_driver_does_not_list_is_run_unfenced_and_says_why() -> None:
    for unknown in ("7", "GPU-zzzz", "MIG-2222"):
        plan = plan_fence(TABLE, [unknown])
        assert plan.deny == () and plan.visible == (unknown,) and unknown in plan.unfenced


def test_all_of_the_machine_s_gpus_need_no_fence_and_no_renumbering() -> None:
    plan = plan_fence(TABLE, ["0", "1", "2"])
    assert plan.deny == () and plan.visible == ("0", "1", "2")


SMI_MIG = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
  MIG 3g.20gb     Device  0: (UUID: MIG-1111)
  MIG 3g.20gb     Device  1: (UUID: MIG-2222)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-bbbb)
  MIG 7g.40gb     Device  0: (UUID: MIG-3333)
"""


def test_mig_instances_are_traced_to_their_gpu(tmp_path: Path) -> None:
    assert parse_mig_parents(SMI_MIG) == {"MIG-1111": 0, "MIG-2222": 0, "MIG-3333": 1}
    fake_smi(tmp_path, SMI_MIG)  # a FAKE nvidia-smi, asked only when the node has MIG ids
    smi = str(tmp_path / "nvidia-smi")
    assert read_gpu_table(["0"], proc=tmp_path, smi=smi).mig_parents == {}
    assert read_gpu_table(["MIG-3333"], proc=tmp_path, smi=smi).mig_parents["MIG-3333"] == 1


def test_the_device_program_jumps_land_inside_it() -> None:
    """Every jump of the program lands on an instruction of it (the verifier would refuse
    the program otherwise, on the one host that loads it), for any number of rules."""
    for rules in ([], [(195, None)], [(195, 1), (195, 3), (511, None)]):
        code = bpf_device.deny_program(rules)
        n = len(code) // 8
        for pc in range(n):
            op, _, off, _ = struct.unpack_from("<BBhi", code, pc * 8)
            if op in (0x15, 0x55):
                assert 0 <= pc + 1 + off < n
    with pytest.raises(ValueError, match="at most"):
        bpf_device.deny_program([(195, 0)] * (bpf_device.MAX_RULES + 1))


def test_a_node_fences_with_v1_devices_when_it_has_them_and_says_why_not_otherwise(tmp_path: Path) -> None:
    v1 = tmp_path / "devices"
    v1.mkdir()
    (v1 / "devices.deny").write_text("")
    layout = CgroupLayout(CgroupKind.V1, cpu_parent=tmp_path / "cpu" / "sluice")
    got = detect_fence(layout, "sluice-x", sysfs=tmp_path)
    assert got.kind is FenceKind.V1 and got.parent == v1 / "sluice-x" and got.parent.is_dir()
    assert "fenced" in got.describe()
    off = detect_fence(layout, "sluice-x", sysfs=tmp_path, enabled=False)
    assert off.kind is FenceKind.NONE and "gpu_fence=off" in off.describe()
    bare = tmp_path / "bare"
    bare.mkdir()
    none = detect_fence(CgroupLayout(CgroupKind.AFFINITY), "sluice", sysfs=bare)
    assert none.kind is FenceKind.NONE and "NOT fenced" in none.describe() and "devices controller" in none.reason


def test_a_driver_module_loaded_after_the_node_started_is_refused_from_then_on(tmp_path: Path) -> None:
    """UVM is often loaded by the first CUDA program, after the node read its table."""
    (tmp_path / "devices").write_text("Character devices:\n195 nvidia-frontend\n")
    table = read_gpu_table(proc=tmp_path)
    assert table.majors == (195,)
    (tmp_path / "devices").write_text(DEVICES)
    now = with_current_majors(table, proc=tmp_path)
    assert plan_fence(now, []).deny == ((195, None), (235, None), (510, None), (511, None))
    assert with_current_majors(now, proc=tmp_path) is now
