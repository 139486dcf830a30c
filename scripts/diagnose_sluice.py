"""Why `sluice` is or is not ahead of `pollux` on one Pollux workload (not a product command).

    PYTHONPATH=src python scripts/diagnose_sluice.py 3 0.5 [--top 12] [--policies sluice,pollux]
    PYTHONPATH=src python scripts/diagnose_sluice.py 1,2,3,4,5,6,7,8 0.5 --top 0 [MEASURED_SLOPE_BELOW=1]

Runs each policy on the workload(s) in the simulator (virtual time, observed mode) and prints:
- per policy: average JCT, the floor (scripts/jct_floor.py), mean share of GPUs held, restarts,
  mean minutes from submission to the first GPU;
- the jobs where the first policy loses most to the second: JCT, queueing, restarts, mean/most
  GPUs, mean nodes, and the first GPU counts it held in order;
- for the first policy (must be `sluice`): the learned curve's error — at each Place/Resize to a
  GPU count the job had not been measured at, the steps/s the curve predicted there against
  the first rate then measured there, split into growth beyond the most measured and the rest;
  and for moves below the fewest GPUs measured (a shrink), with two or more measurements, the
  same ratio for the slope of the two lowest measurements and for the prior exponent, side by
  side on the same moves, with how often that slope was clipped and whether the two lowest
  counts were both multi-node (4 GPUs per node). Over several workloads the check is pooled.
NAME=VALUE sets a constant of `policy/parts/speedup.py` (e.g. MEASURED_SLOPE_BELOW=1: the old rule).
The per-job figures come from the controller's records each round (what `sluice job get`
shows); only the floor reads the simulator's job models.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from sluice.control.simulate import SimConfig, build_model, job_models_dir, pollux_data_dir, run_simulation
from sluice.model import ClusterView, Decision, JobRecord, Phase, Place, Resize
from sluice.policy.parts import speedup
from sluice.policy.parts.speedup import LearnedCurve
from sluice.policy.sluice_policy import SluicePolicy
from sluice.sim.workload import load_workload

sys.path.insert(0, str(Path(__file__).parent))
from jct_floor import alone_s


class CurveCheck(SluicePolicy):
    """`sluice` that notes each prediction at an unmeasured GPU count and its later measurement."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.pending: dict[str, tuple[float, int, float, int, tuple[float, float] | None]] = {}
        self.checked: list[tuple[float, int, int]] = []  # (measured / predicted, k, most measured)
        self.shrinks: list[tuple[float, float]] = []  # (measured / slope's, measured / prior's)
        self.below: Counter[str] = Counter()

    def decide(self, view: ClusterView) -> list[Decision]:
        for jid, (t, k, pred, most, by_slope) in list(self.pending.items()):
            job = view.jobs.get(jid)
            later = [s for s in job.progress.rates if s.gpus == k and s.at > t] if job else []
            if job is None or later:
                if later:
                    rate = min(later, key=lambda s: s.at).steps_per_s
                    self.checked.append((rate / pred, k, most))
                    if by_slope is not None:
                        self.shrinks.append((rate / by_slope[0], rate / by_slope[1]))
                del self.pending[jid]
        out = super().decide(view)
        for d in out:
            if isinstance(d, Place | Resize):
                pr = view.jobs[d.job_id].progress
                noise = pr.noise_scale if self.carry_noise else None  # the curve the policy drew
                curve = LearnedCurve(pr.rates, noise_now=noise, ref_batch=pr.ref_batch, total_steps=pr.total_steps)
                k = d.allocation.total_gpus
                pred = curve.rate(k) or 0.0
                pts = curve.points
                if pred and k not in dict(pts):
                    self.pending[d.job_id] = (view.now, k, pred, curve.most_measured, self._shrink(pts, k))
        return out

    def _shrink(self, pts: list[tuple[int, float]], k: int) -> tuple[float, float] | None:
        """(by the two lowest measurements' slope, by the prior) below the fewest GPUs measured."""
        if len(pts) < 2 or k >= pts[0][0]:
            return None
        (g0, r0), (g1, _) = pts[0], pts[1]
        slope = math.log(pts[1][1] / r0) / math.log(g1 / g0)
        self.below["clipped to 0" if slope <= 0 else "clipped to 1" if slope >= 1 else "within [0, 1]"] += 1
        self.below["both lowest multi-node" if g0 > 4 else "lowest within a node"] += 1
        self.below["moves"] += 1
        return r0 * (k / g0) ** min(max(slope, 0.0), 1.0), r0 * (k / g0) ** speedup.PRIOR_EXPONENT


def summary(ratios: list[float]) -> str:
    if not ratios:
        return "n=0"
    r = sorted(ratios)
    off = sum(1 for x in r if x < 0.8 or x > 1.25) / len(r)
    return (
        f"n={len(r)} median {statistics.median(r):.2f} p10 {r[len(r) // 10]:.2f} "
        f"p90 {r[9 * len(r) // 10]:.2f}, {off:.0%} off by more than 25 %"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", help="a workload number, or several comma-separated")
    ap.add_argument("load", default="1.0")
    ap.add_argument("--policies", default="sluice,pollux")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("constants", nargs="*", help="NAME=VALUE constants of policy/parts/speedup.py")
    a = ap.parse_intermixed_args()
    for kv in a.constants:
        name, value = kv.split("=")
        if not hasattr(speedup, name):
            sys.exit(f"{name}: not a constant of policy/parts/speedup.py")
        setattr(speedup, name, type(getattr(speedup, name))(float(value)))
    check = CurveCheck()
    for w in a.workloads.split(","):
        diagnose(int(w), a.load, a.policies.split(","), a.top, check)
    if "sluice" in a.policies.split(","):
        grow = [r for r, k, most in check.checked if k > most]
        rest = [r for r, k, most in check.checked if k <= most]
        print(f"learned curve, measured/predicted steps/s: growth beyond measured {summary(grow)}")
        print(f"                                          within or below measured {summary(rest)}")
        by_slope = [a for a, _ in check.shrinks]
        by_prior = [b for _, b in check.shrinks]
        print(f"below the fewest measured, two lowest measurements' slope: {summary(by_slope)}")
        print(f"                           prior exponent, same moves:     {summary(by_prior)}")
        print(f"                           {dict(check.below)}")


def diagnose(workload: int, load: str, names: list[str], top: int, check: CurveCheck) -> None:
    folder = pollux_data_dir() / ("workloads" if float(load) == 1.0 else f"workloads-{load}")
    jobs = load_workload(folder / f"workload-{workload}.csv")
    floor = [alone_s(build_model(j, True, job_models_dir())) for j in jobs]  # type: ignore[arg-type]
    print(f"workload {workload} at {load}x: floor {statistics.mean(floor) / 3600:.3f} h")
    runs = {}
    for name in names:
        held: dict[str, list[tuple[int, int]]] = defaultdict(list)
        busy: list[int] = []

        def observe(now: float, recs: list[JobRecord], held: Any = held, busy: list[int] = busy) -> None:
            b = 0
            for r in recs:
                g = r.allocation.total_gpus if r.allocation and r.phase in (Phase.STARTING, Phase.RUNNING) else 0
                nodes = len(r.allocation.nodes) if g and r.allocation else 0
                held[r.id].append((g, nodes))
                b += g
            busy.append(b)

        base, opts = (name[: -len("-prior")], {"learn_speedup": False}) if name.endswith("-prior") else (name, {})
        cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0, policy_options=opts)
        pol: Any = check if name == "sluice" else base
        res = run_simulation(jobs, pol, cfg, observe=observe)
        runs[name] = (res, held)
        queue = [
            next((i for i, (g, _) in enumerate(held[f"s{n:06d}"]) if g), 0) for n in range(len(jobs))
        ]  # rounds of 60 s before the first GPU
        print(
            f"{name:14s} avg JCT {res.avg_jct_s / 3600:.3f} h, GPUs held {statistics.mean(busy) / 64:.0%}, "
            f"restarts {res.restarts}, mean rounds before the first GPU {statistics.mean(queue):.2f}"
        )
    if len(names) >= 2:
        (ra, ha), (rb, hb) = runs[names[0]], runs[names[1]]
        rows = []
        for i, job in enumerate(jobs):
            jid = f"s{i:06d}"
            ja, jb = ra.jobs[i], rb.jobs[i]
            if ja.jct_s is None or jb.jct_s is None:
                continue
            cells = []
            for res, held in ((ra, ha), (rb, hb)):
                run = [(g, n) for g, n in held[jid] if g]
                seq: list[int] = []
                for g, _ in run:
                    if not seq or seq[-1] != g:
                        seq.append(g)
                mean_g = statistics.mean(g for g, _ in run) if run else 0.0
                mean_n = statistics.mean(n for _, n in run) if run else 0.0
                jr = res.jobs[i]
                most = max((g for g, _ in run), default=0)
                jct = (jr.jct_s or 0.0) / 60
                shape = f"GPUs {mean_g:4.1f}/{most:2d} nodes {mean_n:.1f} {seq[:7]}"
                cells.append(f"{jct:6.1f} min r{jr.restarts:2d} {shape}")
            rows.append((ja.jct_s - jb.jct_s, i, job, floor[i], cells))
        rows.sort(key=lambda r: -r[0])
        lose = sum(d for d, *_ in rows if d > 0) / 60
        win = -sum(d for d, *_ in rows if d < 0) / 60
        print(f"{names[0]} vs {names[1]}: loses {lose:.0f} job-min on some jobs, wins {win:.0f} on others")
        for d, i, job, fl, cells in rows[:top]:
            print(f"{d / 60:+6.1f} #{i:<3d} {job.application} asked {job.gpus} floor {fl / 60:5.1f} min")
            for name, cell in zip(names, cells, strict=True):
                print(f"        {name:8s} {cell}")


if __name__ == "__main__":
    main()
