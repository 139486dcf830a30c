"""Would a Pollux-style step-time model predict goodput better than the learned curve? (not a
product command; docs/policies.md, "A fitted step-time model, checked offline").

    PYTHONPATH=src python scripts/throughput_fit_check.py
    PYTHONPATH=src python scripts/throughput_fit_check.py --sim 0.5 [--min-counts 2] [--policy sluice]

Pollux fits each job's time per step from compute and communication terms and picks the
goodput-best batch at any GPU count from it. This checks that idea offline on the simulator's
six measured applications, where the truth is known: at 10 %, 50 % and 90 % of each job's
epochs, it "measures" the true goodput (and the batch and step time the job chose) at a few
GPU counts (the sets in OBSERVED, 4 GPUs per node, consolidated placements), and predicts
every other count from 1 to 64 two ways:

- the learned curve (`speedup.LearnedCurve`, what the policies use): log-log interpolation,
  clipped slope above, the prior below;
- a fitted model: step time T = a + b·(batch / GPUs) + s_node·[one node, > 1 GPU] +
  s_net·[several nodes], non-negative least squares on relative error with weak priors
  (a, s_node ≈ 0.1 of the fastest step, s_net ≈ s_node + 0.1 of it), then goodput at n =
  the best over batches B0..4× the largest batch seen of efficiency(batch) × batch / B0 / T,
  with the noise scale the job reported. Outside the measured range it is used as a ratio to
  the nearest measurement ("hybrid"), inside it the curve is kept.

Prints the median and 90th percentile of |log(predicted / true)| for each. The truth here is
exact and noise-free at one epoch, which flatters both; it bounds what the model could add.

`--sim LOAD`: the same fit in the loop. Every policy's learned curve (`Speedups.curve`) is
replaced, for this run only, by one that predicts outside its measured range with the fit
(anchored at the nearest measurement), fitted from the job's recent rates with the batch and
noise scale each was measured at (what the simulated jobs report, as `sdk` jobs do), once
the job has been measured at `--min-counts` GPU counts or more; the eight Pollux workloads at
LOAD, mean average JCT (hours) and restarts, as `scripts/sweep_learned_curve.py` prints them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable

import numpy as np
from scipy.optimize import nnls

from sluice.model import JobView, RateSample
from sluice.policy.parts import elastic, speedup
from sluice.policy.parts.speedup import LearnedCurve, efficiency
from sluice.sim.apps import SHIPPED_MODELS, Application, load_applications

PER_NODE = 4
OBSERVED: tuple[tuple[int, ...], ...] = (
    (1,), (4,), (12,), (16,), (1, 4), (2, 4), (4, 8), (4, 16), (8, 16), (1, 4, 16),
)  # fmt: skip


def shape(n: int) -> tuple[int, ...]:
    out: list[int] = []
    while n > 0:
        out.append(min(n, PER_NODE))
        n -= out[-1]
    return tuple(out)


def truth(app: Application, n: int, epoch: int) -> tuple[float, int, float, float]:
    """(goodput, batch, seconds per step, noise scale) of the job's own best batch on n GPUs."""
    p = shape(n)
    cfg = app.best_config(p, epoch)
    goodput = app.goodput(p, cfg, epoch)
    batch = cfg.batch_size
    sqr, var = app.grad_stats(epoch, batch)
    return goodput, batch, app.gain(epoch, batch) / goodput, var * app.init_batch_size / sqr


def row(n: int, batch: float) -> list[float]:
    nodes = len(shape(n))
    return [1.0, batch / n, 1.0 if nodes == 1 and n > 1 else 0.0, 1.0 if nodes > 1 else 0.0]


def fit(obs: list[tuple[int, float, float]], prior: float = 0.05) -> np.ndarray:
    """Step-time terms from (GPUs, batch, seconds per step) measurements."""
    a = [[x / t for x in row(n, b)] for n, b, t in obs]
    y = [1.0] * len(obs)
    fastest = min(t for _, _, t in obs)
    w = prior / fastest
    a += [[w, 0, 0, 0], [0, 0, w, 0], [0, 0, -w, w]]
    y += [w * 0.1 * fastest] * 3
    x, _ = nnls(np.array(a), np.array(y))
    return x


def goodput(x: np.ndarray, n: int, noise: float, b0: float, most: float) -> float:
    best = 1e-12
    for batch in np.geomspace(b0, max(most, b0 * 1.01), 40):
        t = float(np.dot(x, row(n, float(batch))))
        if t > 0:
            best = max(best, (noise + b0) / (noise + batch) * (batch / b0) / t)
    return best


def quantiles(v: list[float]) -> str:
    s = sorted(v)
    return f"median {s[len(s) // 2]:.3f} p90 {s[int(0.9 * (len(s) - 1))]:.3f} (n={len(s)})"


class FittedCurve(LearnedCurve):
    """The learned curve inside its measured range, the fitted model's ratio outside it."""

    def __init__(self, samples: Iterable[RateSample], fitted: StepTimeFit | None, **kw: float | None) -> None:
        super().__init__(samples, **kw)  # type: ignore[arg-type]
        self.fitted = fitted

    def rate(self, n: int) -> float | None:
        pts = self.points
        if self.fitted is None or not pts or n <= 0 or pts[0][0] <= n <= pts[-1][0]:
            return super().rate(n)
        anchor = pts[0] if n < pts[0][0] else pts[-1]
        return anchor[1] * self.fitted.goodput(n) / self.fitted.goodput(anchor[0])


class StepTimeFit:
    """`fit` and `goodput` from a job's own rate samples (actual node counts), for the loop."""

    def __init__(self, samples: list[RateSample], ref_batch: float, noise_now: float, per_node: int) -> None:
        self.per_node, self.b0, self.noise = max(per_node, 1), ref_batch, noise_now
        obs = []
        for s in samples:
            assert s.batch is not None and s.noise_scale is not None
            gain = efficiency(s.batch, s.noise_scale, ref_batch) * s.batch / ref_batch
            obs.append((s.gpus, s.nodes, s.batch, gain / s.steps_per_s))
        a = [[x / t for x in node_row(n, k, b)] for n, k, b, t in obs]
        y = [1.0] * len(obs)
        fastest = min(t for *_, t in obs)
        w = 0.05 / fastest
        a += [[w, 0, 0, 0], [0, 0, w, 0], [0, 0, -w, w]]
        y += [w * 0.1 * fastest] * 3
        self.x, _ = nnls(np.array(a), np.array(y))
        self.most = 4 * max(b for _, _, b, _ in obs)
        self._memo: dict[int, float] = {}

    def goodput(self, n: int) -> float:
        if n not in self._memo:
            nodes = -(-n // self.per_node)
            best = 1e-12
            for batch in np.geomspace(self.b0, max(self.most, self.b0 * 1.01), 40):
                t = float(np.dot(self.x, node_row(n, nodes, float(batch))))
                if t > 0:
                    best = max(best, efficiency(float(batch), self.noise, self.b0) * float(batch) / self.b0 / t)
            self._memo[n] = best
        return self._memo[n]


def node_row(n: int, nodes: int, batch: float) -> list[float]:
    return [1.0, batch / n, 1.0 if nodes == 1 and n > 1 else 0.0, 1.0 if nodes > 1 else 0.0]


def in_the_loop(load: str, min_counts: int, policy: str) -> None:
    from sluice.control.simulate import SimConfig, pollux_data_dir, run_simulation
    from sluice.sim.workload import load_workload

    def curve(self: elastic.Speedups, job: JobView) -> LearnedCurve:
        c = self._curves.get(job.id)
        if c is None:
            pr = job.progress
            rates = [r for r in pr.rates if r.gpus > 0 and r.steps_per_s > 0] if self.learn else []
            fitted = None
            if rates and pr.ref_batch and pr.noise_scale:
                newest = max(r.at for r in rates)
                recent = [r for r in rates if r.at >= newest - speedup.STALE_S]
                if all(r.batch and r.noise_scale for r in recent) and len({r.gpus for r in recent}) >= min_counts:
                    fitted = StepTimeFit(recent, pr.ref_batch, pr.noise_scale, self.per_node)
            c = self._curves[job.id] = FittedCurve(pr.rates if self.learn else (), fitted, ref_batch=pr.ref_batch)
        return c

    elastic.Speedups.curve = curve  # type: ignore[method-assign]
    folder = pollux_data_dir() / ("workloads" if float(load) == 1.0 else f"workloads-{load}")
    jcts, restarts = [], 0
    for w in range(1, 9):
        cfg = SimConfig(nodes=16, gpus_per_node=4, interval_s=60.0)
        res = run_simulation(load_workload(folder / f"workload-{w}.csv"), policy, cfg)
        jcts.append(res.avg_jct_s / 3600)
        restarts += res.restarts
    per = " ".join(f"{x:.3f}" for x in jcts)
    print(
        f"{policy}, fitted outside the measured range (>= {min_counts} counts) at {load}x: "
        f"mean {sum(jcts) / len(jcts):.3f} h  per workload {per}  restarts {restarts}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sim", metavar="LOAD", help="run the fit in the loop at this load instead")
    ap.add_argument("--min-counts", type=int, default=2)
    ap.add_argument("--policy", default="sluice")
    a = ap.parse_args()
    if a.sim:
        in_the_loop(a.sim, a.min_counts, a.policy)
        return
    offline()


def offline() -> None:
    errors: dict[str, list[float]] = {k: [] for k in ("curve above", "fit above", "curve below", "fit below")}
    for app in load_applications(str(SHIPPED_MODELS)).values():
        for frac in (0.1, 0.5, 0.9):
            epoch = int(frac * (app.max_epochs - 1))
            tr = {n: truth(app, n, epoch) for n in range(1, 65)}
            b0 = float(app.init_batch_size)
            for seen in OBSERVED:
                obs = [(n, float(tr[n][1]), tr[n][2]) for n in seen]
                x = fit(obs)
                noise, most = tr[seen[-1]][3], 4 * max(b for _, b, _ in obs)
                curve = LearnedCurve([RateSample(n, len(shape(n)), n, tr[n][0], 120.0, 1000.0) for n in seen])
                lo, hi = min(seen), max(seen)
                for n in range(1, 65):
                    if lo <= n <= hi:
                        continue
                    anchor = hi if n > hi else lo
                    ratio = goodput(x, n, noise, b0, most) / goodput(x, anchor, noise, b0, most)
                    side = "above" if n > hi else "below"
                    errors[f"curve {side}"].append(abs(math.log((curve.rate(n) or 1e-12) / tr[n][0])))
                    errors[f"fit {side}"].append(abs(math.log(tr[anchor][0] * ratio / tr[n][0])))
    for k, v in errors.items():
        print(f"|log(predicted / true)|, {k:11s}: {quantiles(v)}")
    ncf = load_applications(str(SHIPPED_MODELS))["ncf"]
    half = int(0.5 * (ncf.max_epochs - 1))
    steps = ", ".join(f"{n} GPUs {truth(ncf, n, half)[2]:.3f} s" for n in (1, 2, 4, 8, 16))
    print(f"why: ncf's seconds per step at half its epochs, at its best batch: {steps}")


if __name__ == "__main__":
    main()
