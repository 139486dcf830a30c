"""`sluice bench sim`: every policy side by side in the simulator.

Three parts:
- **pollux**: each GPU policy on the eight Pollux workloads at 0.5×/1.0×/1.5×/2.0× load (16 nodes
  × 4 GPUs, 60 s rounds), mean of the per-workload average JCTs, beside the published
  Pollux, Optimus+Oracle and Tiresias numbers (results-jobload/*/summary.json, the mean over
  the same workloads), as ratios;
- **cpu**: FlowCon's CPU-job setups (4 nodes × 20 jobs, 8 nodes × 60 jobs, staggered
  arrivals): average JCT, makespan and QoE targets met, versus `kube`;
- **scale**: a Philly-derived workload (20,000 jobs on 5,000 nodes × 8 GPUs by default): wall
  time and the controller's time per round.
Runs go to a process pool (one worker per core): each simulation is single-threaded.

By default policies see only what a real engine observes. `oracle=True` (`--oracle`) gives
them the simulator's ground truth instead; every table and the JSON then say "oracle (upper
bound)": those numbers bound what the policies could reach, they are not results.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sluice.control.simulate import (
    SimConfig,
    cpu_workload,
    load_workload,
    mode_label,
    require_pollux_data,
    run_simulation,
)
from sluice.policy.registry import VARIANTS as VARIANTS  # the one list of variants; rows run them by name

GPU_POLICIES = ("fifo", "binpack", "kube", "tiresias", "optimus", "pollux", "pollux-prior", "sluice", "sluice-prior")
LOADS = ("0.5", "1.0", "1.5", "2.0")
PUBLISHED = ("pollux", "optimus", "tiresias")
CPU_POLICIES = ("kube", "flowcon", "specon", "dqoes", "sluice")
CPU_SETUPS = ((4, 20, 30.0), (8, 60, 20.0))
"""(nodes, jobs, seconds between arrivals): FlowCon 2.0's two cluster setups."""

console = Console(highlight=False)


def needed_data(parts: list[str], loads: list[str]) -> list[str]:
    """What the chosen parts read from the Pollux data folder, so a missing piece is reported
    before hours of simulation rather than after ("cpu" needs nothing: synthetic jobs; the
    published results are optional, their columns stay empty without them)."""
    need: list[str] = []
    if "pollux" in parts:
        need += [str(_workload_file(Path(), load, 1).parent) for load in loads]
    if "scale" in parts:
        need.append("traces/philly.csv")
    return need


def _workload_file(base: Path, load: str, w: int) -> Path:
    folder = "workloads" if load == "1.0" else f"workloads-{load}"
    return base / folder / f"workload-{w}.csv"


def _title(text: str, oracle: bool) -> str:
    return f"{text} — {mode_label(oracle).upper()}" if oracle else text


def _one_gpu(args: tuple[str, str, int, str, bool]) -> tuple[str, str, int, float, int, float]:
    policy, load, w, base, oracle = args
    jobs = load_workload(_workload_file(Path(base), load, w))
    t0 = time.perf_counter()
    cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0, oracle=oracle)
    res = run_simulation(jobs, policy, cfg)  # a variant (pollux-prior, ...) by name: make_policy knows it
    return policy, load, w, res.avg_jct_s, res.restarts, time.perf_counter() - t0


def _one_cpu(args: tuple[str, int, int, float, bool]) -> dict[str, Any]:
    policy, nodes, n, stagger, oracle = args
    res = run_simulation(
        cpu_workload(n, stagger_s=stagger),
        policy,
        SimConfig(nodes=nodes, gpus_per_node=0, cpus_per_node=8, interval_s=10, oracle=oracle),
    )
    met, total = res.qoe
    return {
        "policy": policy,
        "mode": mode_label(oracle),
        "setup": f"{nodes}x{n}",
        "avg_jct_s": res.avg_jct_s,
        "makespan_s": res.makespan_s,
        "qoe_met": met,
        "qoe_total": total,
        "restarts": res.restarts,
    }


def published(base: Path, workloads: list[int] | None = None) -> dict[str, dict[str, float]]:
    """Published mean of per-workload average JCTs (seconds), policy -> load -> value, over
    `workloads` (default all eight), so a run on some workloads is set beside the same ones. A
    summary without the per-workload averages it needs is left out."""
    out: dict[str, dict[str, float]] = {}
    for p in PUBLISHED:
        for load in LOADS:
            f = base / "results-jobload" / f"{p}-{load}" / "summary.json"
            if not f.exists():
                continue
            summary = json.loads(f.read_text())
            if workloads is None or sorted(set(workloads)) == list(range(1, 9)):
                out.setdefault(p, {})[load] = float(summary["mean"])
                continue
            avgs = summary.get("avgs", {})
            if all(f"workload-{w}" in avgs for w in workloads):
                out.setdefault(p, {})[load] = sum(float(avgs[f"workload-{w}"]) for w in workloads) / len(workloads)
    return out


def run_pollux(
    policies: list[str], loads: list[str], workloads: list[int], workers: int, base: Path, oracle: bool = False
) -> dict[str, dict[str, float]]:
    tasks = [(p, load, w, str(base), oracle) for p in policies for load in loads for w in workloads]
    acc: dict[tuple[str, str], list[float]] = {}
    per_w: dict[tuple[str, str, int], float] = {}
    restarts: dict[tuple[str, str], int] = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as ex:
        for i, (p, load, w, avg, rs, _wall) in enumerate(ex.map(_one_gpu, tasks), start=1):
            acc.setdefault((p, load), []).append(avg)
            per_w[(p, load, w)] = avg
            restarts[(p, load)] = restarts.get((p, load), 0) + rs
            console.print(f"  [{i}/{len(tasks)}] {p} {load}× done ({time.perf_counter() - started:.0f}s)", end="\r")
    console.print()
    ours = {p: {load: sum(acc[(p, load)]) / len(acc[(p, load)]) for load in loads} for p in policies}
    pub = published(base, workloads)
    tiresias_pub = pub.get("tiresias", {})

    t = Table(
        title=_title(
            f"Average JCT (hours), mean of workloads {','.join(map(str, workloads))}; ratio to published Tiresias",
            oracle,
        )
    )
    t.add_column("policy")
    for load in loads:
        t.add_column(f"{load}×", justify="right")
    tag = f", {mode_label(True)}" if oracle else ""
    for p in policies:
        t.add_row(p + tag, *[_cell(ours[p][load], tiresias_pub.get(load)) for load in loads])
    for p in PUBLISHED:
        if p in pub and all(load in pub[p] for load in loads):
            t.add_row(f"{p} (published)", *[_cell(pub[p][load], tiresias_pub.get(load)) for load in loads])
    console.print(t)

    f = Table(title=_title("Fidelity: ours / published for the same policy (1.00 = identical)", oracle))
    f.add_column("policy")
    for load in loads:
        f.add_column(f"{load}×", justify="right")
    for p in PUBLISHED:
        if p in ours and p in pub:
            f.add_row(p + tag, *[f"{ours[p][load] / pub[p][load]:.3f}" for load in loads])
    console.print(f)
    r = Table(title=_title("Restarts (allocation changes), summed over the workloads", oracle))
    r.add_column("policy")
    for load in loads:
        r.add_column(f"{load}×", justify="right")
    for p in policies:
        r.add_row(p + tag, *[str(restarts[(p, load)]) for load in loads])
    console.print(r)
    if "sluice" in ours and "1.0" in loads:
        s = ours["sluice"]["1.0"]
        msg = []
        if "1.0" in tiresias_pub:
            msg.append(
                f"sluice at 1.0×: {s / 3600:.3f} h = {1 - s / tiresias_pub['1.0']:+.1%} below published Tiresias"
            )
        if "tiresias" in ours:
            msg.append(f"{1 - s / ours['tiresias']['1.0']:+.1%} below our Tiresias")
        if "pollux" in pub:
            msg.append(
                f"{1 - s / pub['pollux']['1.0']:+.1%} below published Pollux ({pub['pollux']['1.0'] / 3600:.2f} h)"
            )
        console.print(("ORACLE (UPPER BOUND): " if oracle else "") + "; ".join(msg))
    if {"sluice", "pollux"} <= set(ours):
        _goals(ours, per_w, restarts, pub, loads, workloads, oracle)
    return {p: {load: v / 3600 for load, v in d.items()} for p, d in ours.items()}


def _goals(
    ours: dict[str, dict[str, float]],
    per_w: dict[tuple[str, str, int], float],
    restarts: dict[tuple[str, str], int],
    pub: dict[str, dict[str, float]],
    loads: list[str],
    workloads: list[int],
    oracle: bool,
) -> None:
    """Issue 14's goals for `sluice`, per load: average JCT at most 0.9x our `pollux` on every
    workload (against the better of its learned and prior variants when both ran), mean below
    the published Pollux, and at most 2x Pollux's restarts."""
    t = Table(title=_title("Goals for sluice: JCT ratio to our best pollux per workload, restarts ratio", oracle))
    for c in ("load", "worst workload (ratio)", "workloads <= 0.9x", "mean / published Pollux", "restarts / pollux"):
        t.add_column(c, justify="right")
    rivals = [p for p in ("pollux", "pollux-prior") if p in ours]
    for load in loads:
        ratios = {w: per_w[("sluice", load, w)] / min(per_w[(p, load, w)] for p in rivals) for w in workloads}
        worst = max(ratios, key=lambda w: ratios[w])
        ok = sum(1 for r in ratios.values() if r <= 0.9)
        best = min(rivals, key=lambda p: restarts[(p, load)])
        pub_p = pub.get("pollux", {}).get(load)
        t.add_row(
            f"{load}x",
            f"w{worst} ({ratios[worst]:.2f})",
            f"{ok}/{len(workloads)}",
            f"{ours['sluice'][load] / pub_p:.2f}" if pub_p else "-",
            f"{restarts[('sluice', load)] / max(restarts[(best, load)], 1):.2f} (vs {best})",
        )
    console.print(t)


def _cell(v: float, ref: float | None) -> str:
    if math.isnan(v):
        return "-"
    return f"{v / 3600:.3f} ({v / ref:.2f})" if ref else f"{v / 3600:.3f}"


def run_cpu(policies: list[str], workers: int, oracle: bool = False) -> list[dict[str, Any]]:
    tasks = [(p, nodes, n, st, oracle) for nodes, n, st in CPU_SETUPS for p in policies]
    with ProcessPoolExecutor(max_workers=workers) as ex:
        rows = list(ex.map(_one_cpu, tasks))
    t = Table(title=_title("CPU container jobs (FlowCon setups): ratio to kube in brackets", oracle))
    for c in ("nodes×jobs", "policy", "avg JCT (min)", "makespan (min)", "QoE met", "restarts"):
        t.add_column(c, justify="left" if c in ("setup", "policy") else "right")
    for nodes, n, _st in CPU_SETUPS:
        setup = f"{nodes}x{n}"
        base = next((r for r in rows if r["setup"] == setup and r["policy"] == "kube"), None)
        for r in (r for r in rows if r["setup"] == setup):
            jr = f" ({r['avg_jct_s'] / base['avg_jct_s']:.2f})" if base else ""
            mr = f" ({r['makespan_s'] / base['makespan_s']:.2f})" if base else ""
            t.add_row(
                f"{nodes}×{n}",
                r["policy"] + (f", {r['mode']}" if oracle else ""),
                f"{r['avg_jct_s'] / 60:.1f}{jr}",
                f"{r['makespan_s'] / 60:.1f}{mr}",
                f"{r['qoe_met']}/{r['qoe_total']}",
                str(r["restarts"]),
            )
    console.print(t)
    return rows


def run_scale(
    policy: str,
    jobs: int,
    nodes: int,
    load_factor: float,
    base: Path,
    hours: float | None = None,
    oracle: bool = False,
) -> dict[str, Any]:
    trace = base / "traces" / "philly.csv"
    wl = load_workload(trace, window_start_h=24 * 40, load_factor=load_factor, max_jobs=jobs)
    console.print(
        f"scale: {len(wl)} Philly jobs (from day 40, arrivals ×{load_factor:g} -> {wl[-1].submit_time / 3600:.1f} h) "
        f"on {nodes} nodes × 8 GPUs, policy {policy}"
    )
    cfg = SimConfig(
        nodes=nodes, gpus_per_node=8, interval_s=60.0, max_time_s=hours * 3600 if hours else None, oracle=oracle
    )
    res = run_simulation(wl, policy, cfg)
    rounds = sorted(res.round_seconds)
    busy = [r for r in res.round_seconds if r > 0]
    summary = {
        "policy": policy,
        "mode": res.mode,
        "jobs": len(wl),
        "submitted": len(res.jobs),
        "finished": len(res.finished),
        "nodes": nodes,
        "rounds": res.rounds,
        "wall_s": res.wall_s,
        "round_mean_ms": res.mean_round_s * 1000,
        "round_p99_ms": rounds[min(len(rounds) - 1, int(0.99 * len(rounds)))] * 1000 if rounds else 0.0,
        "round_max_ms": res.max_round_s * 1000,
        "busy_rounds": len(busy),
        "avg_jct_h": res.avg_jct_s / 3600,
        "makespan_h": res.makespan_s / 3600,
    }
    t = Table(title=_title("Scale", oracle))
    t.add_column("measure")
    t.add_column("value", justify="right")
    for k, v in summary.items():
        t.add_row(k, f"{v:.1f}" if isinstance(v, float) else str(v))
    console.print(t)
    return summary


def run(
    *,
    parts: list[str],
    policies: list[str] | None = None,
    loads: list[str] | None = None,
    workloads: list[int] | None = None,
    cpu_policies: list[str] | None = None,
    workers: int | None = None,
    scale_policy: str = "sluice",
    scale_jobs: int = 20_000,
    scale_nodes: int = 5_000,
    scale_load_factor: float = 10.0,
    scale_hours: float | None = None,
    out: Path | None = None,
    oracle: bool = False,
) -> dict[str, Any]:
    base = require_pollux_data(*needed_data(parts, list(loads or LOADS)))
    workers = workers or os.cpu_count() or 1
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} CPU cores", "mode": mode_label(oracle)}
    t0 = time.perf_counter()
    if "pollux" in parts:
        results["pollux"] = run_pollux(
            policies or list(GPU_POLICIES), loads or list(LOADS), workloads or list(range(1, 9)), workers, base, oracle
        )
    if "cpu" in parts:
        results["cpu"] = run_cpu(cpu_policies or list(CPU_POLICIES), workers, oracle)
    if "scale" in parts:
        results["scale"] = run_scale(
            scale_policy, scale_jobs, scale_nodes, scale_load_factor, base, scale_hours, oracle
        )
    results["wall_s"] = time.perf_counter() - t0
    mode = f" ({mode_label(oracle)})" if oracle else ""
    console.print(f"bench sim{mode} finished in {results['wall_s']:.0f}s on {workers} worker(s)")
    if out is not None:
        out.write_text(json.dumps(results, indent=2))
    return results
