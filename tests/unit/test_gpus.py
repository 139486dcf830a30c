"""Which GPUs the local engine hands out: CUDA_VISIBLE_DEVICES when set, else the machine's.

This machine has no GPU, so the `nvidia-smi` here is a FAKE: a script printing what the real
one prints on a GPU box (`nvidia-smi -L`, as read on an H100 machine and on a MIG-split A100's
documented output). The real one ran on an H100 (docs/benchmarks.md, "GPU check").
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sluice.agent import gpus
from sluice.agent.gpus import (
    GpuDiscovery,
    discover_gpus,
    from_env,
    parse_mig_modes,
    parse_smi_list,
    process_env,
    ray_node_gpus,
)
from sluice.agent.kpi import KpiSampler

TWO_GPUS = (
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-3f1c0d2e-0000-0000-0000-000000000000)\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3f1c0d2e-0000-0000-0000-000000000001)\n"
)
MIG = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-0000-0000-0000-000000000000)\n"
    "  MIG 3g.20gb     Device  0: (UUID: MIG-1a2b3c4d-0000-5000-8000-000000000000)\n"
    "  MIG 3g.20gb     Device  1: (UUID: MIG-1a2b3c4d-0000-5000-8000-000000000001)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-0000-0000-0000-000000000001)\n"
)


MIG_EMPTY = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-0000-0000-0000-000000000000)\n"
    "  MIG 3g.20gb     Device  0: (UUID: MIG-1a2b3c4d-0000-5000-8000-000000000000)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-0000-0000-0000-000000000001)\n"
    "GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-0000-0000-0000-000000000002)\n"
)
"""`-L` on a box whose GPU 1 is in MIG mode with no instances: listed exactly like GPU 2, which
has no MIG mode on (nvidia-smi prints MIG lines only for instances that exist)."""
MIG_EMPTY_MODES = "0, Enabled\n1, Enabled\n2, Disabled\n"
"""`--query-gpu=index,mig.mode.current --format=csv,noheader` on that box."""


def fake_smi(folder: Path, output: str, code: int = 0, modes: str | None = None, modes_sleep_s: float = 0) -> Path:
    """A stand-in `nvidia-smi` that prints `output` for `-L` and exits `code`; for the MIG-mode
    query it prints `modes` (after `modes_sleep_s`), or, where `modes` is None, exits 9 as an
    nvidia-smi that cannot answer it would."""
    path = folder / "nvidia-smi"
    query = "--query-gpu=index,mig.mode.current" if modes is not None else "never"
    path.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = {query} ]; then sleep {modes_sleep_s}; cat <<'EOF'\n{modes or ''}EOF\nexit 0; fi\n"
        f"[ \"$1\" = -L ] || exit 9\ncat <<'EOF'\n{output}EOF\nexit {code}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_cuda_visible_devices_decides_when_set_even_empty(tmp_path: Path) -> None:
    smi = str(fake_smi(tmp_path, TWO_GPUS))
    assert discover_gpus({"CUDA_VISIBLE_DEVICES": "1"}, smi=smi).ids == ["1"]
    assert discover_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi=smi).ids == []  # the operator's "none"
    assert discover_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, smi=smi).ids == []


def test_unset_finds_the_machines_gpus(tmp_path: Path) -> None:
    found = discover_gpus({}, smi=str(fake_smi(tmp_path, TWO_GPUS)))
    assert found.ids == ["0", "1"] and found.source == "nvidia-smi -L"


def test_no_driver_or_a_failing_smi_means_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no bindings either (a GPU machine has them)
    assert discover_gpus({}, smi=str(tmp_path / "missing")).ids == []
    broken = fake_smi(tmp_path, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n", code=9)
    assert discover_gpus({}, smi=str(broken)).ids == []


def test_without_nvidia_smi_nvml_counts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    found = discover_gpus({}, smi=str(tmp_path / "missing"))
    assert found.ids == ["0", "1"] and found.source == "NVML"


def test_cuda_stops_at_the_first_invalid_entry() -> None:
    assert from_env({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == ["0"]
    assert from_env({"CUDA_VISIBLE_DEVICES": " 2 , 3 "}) == ["2", "3"]
    assert from_env({"CUDA_VISIBLE_DEVICES": "0,0,1"}) == ["0", "1"]  # one GPU is handed out once
    assert from_env({}) is None


def test_mig_instances_are_handed_out_one_by_one() -> None:
    assert parse_smi_list(MIG) == [
        "MIG-1a2b3c4d-0000-5000-8000-000000000000",
        "MIG-1a2b3c4d-0000-5000-8000-000000000001",
        "1",
    ]


def test_a_gpu_in_mig_mode_without_instances_is_left_out_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Handed out by index, such a GPU showed CUDA no device: a job given it found none. GPUs
    with instances (per instance) and GPUs without MIG (by index) are handed out as before."""
    smi = str(fake_smi(tmp_path, MIG_EMPTY, modes=MIG_EMPTY_MODES))
    with caplog.at_level("WARNING", logger="sluice.agent.gpus"):
        found = discover_gpus({}, smi=smi)
    assert found.ids == ["MIG-1a2b3c4d-0000-5000-8000-000000000000", "2"]
    assert found.left_out == (f"GPU 1 ({gpus.MIG_NO_INSTANCES})",)
    assert found.summary() == (
        "GPUs to hand out: MIG-1a2b3c4d-0000-5000-8000-000000000000,2 (found with nvidia-smi -L); "
        "left out: GPU 1 (MIG mode is on and it has no MIG instances: CUDA would show a job given it no device)"
    )
    assert "not handing out GPU 1 (MIG mode is on" in caplog.text
    assert parse_smi_list(MIG_EMPTY, mig_on={"1"}) == found.ids


def test_mig_modes_as_nvidia_smi_prints_them() -> None:
    assert parse_mig_modes("0, Enabled\n1, Disabled\n2, [N/A]\n3, enabled\n\nbad line\n") == {"0", "3"}


@pytest.mark.parametrize("how", ["fails", "times out"])
def test_mig_modes_that_cannot_be_read_cost_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """The MIG query failing (an nvidia-smi that does not know the field) or hanging: every GPU
    `-L` listed is handed out, as before the query was asked, and the log says so."""
    monkeypatch.setattr(gpus, "SMI_TIMEOUT_S", 1.0)
    modes = None if how == "fails" else MIG_EMPTY_MODES
    smi = str(fake_smi(tmp_path, MIG_EMPTY, modes=modes, modes_sleep_s=0 if how == "fails" else 5))
    with caplog.at_level("WARNING", logger="sluice.agent.gpus"):
        found = discover_gpus({}, smi=smi)
    assert found.ids == ["MIG-1a2b3c4d-0000-5000-8000-000000000000", "1", "2"] and found.left_out == ()
    assert "could not say which GPUs are in MIG mode" in caplog.text


class FakeNvml:
    """A FAKE `pynvml` (no GPU here) for two GPUs: GPU i is 10·(i+1) % busy. The real bindings
    were read on an H100 (docs/benchmarks.md, "GPU check")."""

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=10 * (h + 1))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=1, total=4)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 40


def test_a_node_reads_only_its_own_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A virtual node holding GPU 1 reports gpu1_*, not GPU 0 (another node's); before, every
    node reported every GPU of the machine."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    values = KpiSampler([0], gpus=["1"]).sample()
    assert {k: v for k, v in values.items() if k.startswith("gpu")} == {
        "gpu1_util_pct": 20.0,
        "gpu1_mem_pct": 25.0,
        "gpu1_temp_c": 40.0,
    }
    assert not any(k.startswith("gpu") for k in KpiSampler([0], gpus=[]).sample())
    assert {k for k in KpiSampler([0], gpus=True).sample() if k.endswith("util_pct")} == {
        "gpu0_util_pct",
        "gpu1_util_pct",
    }


def test_a_job_counts_its_gpu_index_as_nvidia_smi_and_nvml_do(tmp_path: Path) -> None:
    """The ids handed out are nvidia-smi's (NVML's, PCI bus order) and a node reads NVML's
    KPIs by them; CUDA counts its devices fastest first unless CUDA_DEVICE_ORDER says
    PCI_BUS_ID. On a machine of mixed GPUs the job given "1" then ran on another GPU than the
    one placement gave it (and the node's KPIs described): possibly one held by another job.
    A spec cannot change the order either (it is set per attempt, refused at submit)."""
    from sluice.agent.launchenv import build_env
    from sluice.model import Allocation, LaunchRequest
    from sluice.spec import JobSpec
    from sluice.spec.job import SET_PER_ATTEMPT

    spec = JobSpec(command=["python", "-c", "pass"], env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})
    req = LaunchRequest("j", 1, "t1", spec, Allocation.single("n0"), "/tmp/ck")
    env = build_env(req, run_dir=tmp_path, node="n0", node_cpus=1, gpus=["1"], base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_DEVICE_ORDER" in SET_PER_ATTEMPT


class FakeMigNvml(FakeNvml):
    """A FAKE `pynvml` (no GPU here) for three GPUs as MIG_EMPTY: GPU 0 in MIG mode with one
    instance, GPU 1 in MIG mode with none, GPU 2 without MIG (NVML raises NotSupported)."""

    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception): ...

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetMigMode(self, h: int) -> tuple[int, int]:
        if h == 2:
            raise self.NVMLError("Not Supported")
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, slot: int) -> str:
        if h == 0 and slot == 0:
            return "mig-0-0"
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        assert h == "mig-0-0"
        return b"MIG-1a2b3c4d-0000-5000-8000-000000000000"


def test_without_nvidia_smi_nvml_leaves_out_a_mig_gpu_without_instances_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML counted GPUs by index only: a MIG-mode GPU without instances was handed out (no
    device for CUDA), one with instances showed a job only its first."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeMigNvml())
    found = discover_gpus({}, smi=str(tmp_path / "missing"))
    assert found.ids == ["MIG-1a2b3c4d-0000-5000-8000-000000000000", "2"] and found.source == "NVML"
    assert [why.split(" (")[0] for why in found.left_out] == ["GPU 1"]


def test_a_ray_node_hands_out_the_gpus_its_raylet_was_given() -> None:
    """Ray's GPU slot i on a node is its raylet's CUDA_VISIBLE_DEVICES[i]: a raylet started
    under CUDA_VISIBLE_DEVICES=2,3 gave its jobs GPUs 0 and 1 (an operator's, kept for other
    work). The real multi-node case: tests/integration/test_ray_gpus.py."""
    assert ray_node_gpus(2, {"CUDA_VISIBLE_DEVICES": "2,3"}).ids == ["2", "3"]
    assert ray_node_gpus(1, {"CUDA_VISIBLE_DEVICES": "2,3"}).ids == ["2"]  # ray start --num-gpus 1
    assert ray_node_gpus(2, {}).ids == ["0", "1"]  # unset: Ray's own 0..n-1
    assert ray_node_gpus(0, {"CUDA_VISIBLE_DEVICES": "2,3"}).ids == []
    short = ray_node_gpus(2, {"CUDA_VISIBLE_DEVICES": "2,-1,3"})  # CUDA stops at -1; Ray would not
    assert short.ids == ["2"] and [w.split(" (")[0] for w in short.left_out] == ["Ray's GPU 1"]


def test_process_env_reads_what_a_process_was_started_with() -> None:
    import subprocess

    env = {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin:/bin"}
    script = "import time; print('up', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    try:
        # once it speaks it has exec'd (before, /proc shows this process's environment, or none)
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        assert process_env(child.pid) == {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/usr/bin:/bin"}
    finally:
        child.kill()
        child.wait()
    assert process_env(child.pid) is None  # gone


def test_a_summary_of_no_gpus_reads_as_a_sentence() -> None:
    """Said as "none (found with none found (no nvidia-smi, no NVML))" before; a source that
    is itself the reason for none is said alone, one that looked and found nothing keeps
    "found with"."""
    assert discover_gpus({}, smi="/nonexistent/nvidia-smi").summary() in (
        "GPUs to hand out: none (no nvidia-smi and no NVML on this machine)",
        "GPUs to hand out: none (found with NVML)",  # where pynvml is installed and finds none
    )
    assert gpus.ray_node_gpus(0, {}).summary() == "GPUs to hand out: none (Ray counts none on this node)"
    assert GpuDiscovery([], "CUDA_VISIBLE_DEVICES").summary() == (
        "GPUs to hand out: none (found with CUDA_VISIBLE_DEVICES)"
    )
