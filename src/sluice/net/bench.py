"""`sluice net bench`: build each datapath in turn, measure it, tear it down, collect JSON.

One datapath at a time (its own namespaces), so the measurements never share a link, and a
failure in one is recorded under its name while the others still run. The lab itself is
torn down on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice.net import measure
from sluice.net.datapaths import DATAPATHS, availability
from sluice.net.detect import detect
from sluice.net.ipcmd import tool
from sluice.net.lab import Lab

KB, MB = 1024, 1024 * 1024
FULL_SIZES = tuple(KB * 4**i for i in range(10))  # 1 KiB, 4 KiB, ... 256 MiB
MEASUREMENTS = ("tcp", "latency", "allreduce", "ddp", "data")


@dataclass
class BenchConfig:
    datapaths: list[str] | None = None
    """None: every datapath this machine can build."""
    skip: set[str] = field(default_factory=set)
    """Measurements (MEASUREMENTS) not to run."""
    mtu: int = 1500
    duration_s: int = 5
    """Seconds per iperf3 run (whole seconds: iperf3 truncates)."""
    streams: int = 4
    repeats: int = 3
    rr_count: int = 2000
    rr_size: int = 64
    sizes: tuple[int, ...] = FULL_SIZES
    allreduce_rounds: int = 10
    allreduce_budget_s: float = 20.0
    ddp_steps: int = 60
    data_small: int = 200
    data_small_kb: int = 64
    data_large: int = 4
    data_large_mb: int = 32
    data_threads: int = 8

    def __post_init__(self) -> None:
        unknown = [d for d in self.datapaths or [] if d not in DATAPATHS]
        if unknown:
            raise ValueError(f"datapaths: unknown {unknown}; known: {', '.join(DATAPATHS)}")
        bad = sorted(self.skip - set(MEASUREMENTS))
        if bad:
            raise ValueError(f"skip: unknown {bad}; known: {', '.join(MEASUREMENTS)}")
        if not 576 <= self.mtu <= 65535:
            raise ValueError(f"mtu: {self.mtu} is outside 576..65535")
        if self.repeats < 1 or self.duration_s < 1 or self.streams < 1:
            raise ValueError("repeats, duration_s (whole seconds) and streams must be at least 1")


def _tool_version(name: str) -> str | None:
    exe = tool(name)
    if exe is None:
        return None
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    return (proc.stdout or proc.stderr).splitlines()[0] if (proc.stdout or proc.stderr) else exe


def machine() -> dict[str, Any]:
    import torch

    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "iperf3": _tool_version("iperf3"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def measure_one(lab: Lab, name: str, cfg: BenchConfig, data_root: Path, say: Callable[[str], None]) -> dict[str, Any]:
    d = DATAPATHS[name]
    assert d.build is not None
    ep = d.build(lab, cfg.mtu)
    res: dict[str, Any] = {"cni": d.cni, "what": d.what, "cross_node": d.cross_node, "iface": ep.iface}
    res["mtu"] = measure.mtu_of(ep)
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("tcp_1", lambda: measure.iperf3(lab, ep, streams=1, duration_s=cfg.duration_s, repeats=cfg.repeats)),
        ("tcp_n", lambda: measure.iperf3(lab, ep, streams=cfg.streams, duration_s=cfg.duration_s, repeats=cfg.repeats)),
        ("latency", lambda: measure.latency(lab, ep, count=cfg.rr_count, size=cfg.rr_size, repeats=cfg.repeats)),
        ("allreduce", lambda: measure.allreduce(lab, ep, sizes=cfg.sizes, rounds=cfg.allreduce_rounds,
                                                budget_s=cfg.allreduce_budget_s)),
        ("ddp", lambda: measure.ddp_step(lab, ep, steps=cfg.ddp_steps, repeats=cfg.repeats)),
        ("data", lambda: measure.dataload(lab, ep, root=data_root, threads=cfg.data_threads, repeats=cfg.repeats)),
    ]  # fmt: skip
    for key, run in steps:
        group = "tcp" if key.startswith("tcp") else key
        if group in cfg.skip:
            continue
        say(f"{name}: {key}")
        t0 = time.monotonic()
        try:
            res[key] = run()
        except Exception as err:  # one failed measurement must not lose the others
            res[key] = {"error": f"{type(err).__name__}: {err}"}
        res.setdefault("wall_s", {})[key] = round(time.monotonic() - t0, 2)
    return res


def run_bench(cfg: BenchConfig, say: Callable[[str], None] = lambda s: None, lab: Lab | None = None) -> dict[str, Any]:
    """Detect, then build and measure each datapath; returns the JSON-able results."""
    own = lab is None
    lab = lab or Lab()
    ctx = lab if own else None
    if ctx is not None:
        ctx.__enter__()
    try:
        started = time.time()
        mach = machine()
        say(f"run {lab.run_id}: probing kernel features")
        features = detect(lab)
        avail = availability(features)
        wanted = cfg.datapaths or [n for n, why in avail.items() if why is None]
        out: dict[str, Any] = {
            "run_id": lab.run_id,
            "started": started,
            "machine": mach,
            "config": {**asdict(cfg), "skip": sorted(cfg.skip), "sizes": list(cfg.sizes)},
            "features": {k: v.to_json() for k, v in features.items()},
            # Only what was asked for: `--datapaths bridge` listed five tunnels nobody wanted.
            "unavailable": {n: why for n, why in avail.items() if why is not None and n in wanted},
            "datapaths": {},
        }
        data_root = Path(tempfile.mkdtemp(prefix="sluice-net-dataset-"))
        try:
            if "data" not in cfg.skip:
                from sluice.net.dataload import make

                make(data_root, cfg.data_small, cfg.data_small_kb, cfg.data_large, cfg.data_large_mb)
            for name in wanted:
                if avail[name] is not None:
                    out["datapaths"][name] = {"skipped": avail[name]}
                    continue
                say(f"{name}: building")
                n_before = len(lab.namespaces)
                try:
                    out["datapaths"][name] = measure_one(lab, name, cfg, data_root, say)
                except Exception as err:
                    out["datapaths"][name] = {"error": f"{type(err).__name__}: {err}"}
                finally:
                    lab.teardown_from(n_before)
        finally:
            shutil.rmtree(data_root, ignore_errors=True)
        out["machine"]["loadavg_after"] = list(os.getloadavg())
        out["wall_s"] = round(time.time() - started, 1)
        return out
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
