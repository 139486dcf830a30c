"""A job's speed at GPU counts it has not run at, learned from the speeds it was measured at.

Why learned: with adaptive batch sizes a job's goodput curve depends on the model, the
batch-size range and how far training has got; the same (n / requested)^0.8 for every job
was wrong by 4× either way on the measured Pollux applications (yolov3 at epoch 0 runs
*slower* on 8 GPUs than on 1; cifar10 near the end is super-linear). Pollux fits a
throughput model per job from the step times its agent measures; this is the same idea
with what every engine reports: steps per second at each allocation shape the job has held
(`ProgressSignals.rates`, start-up excluded by the tracker).

The curve, in log-log space:
- at a measured GPU count: the latest measurement;
- between two measured counts: interpolated;
- above the measured range: extended from the most GPUs measured with the slope of the two
  largest measurements (one measurement: the prior exponent), clipped to [0, 1] so a job is
  never predicted to lose speed, nor to scale super-linearly, where nobody looked;
- below it (GPUs): scaled down from the fewest GPUs measured with the prior exponent, not
  with the slope measured above (`MEASURED_SLOPE_BELOW`): that slope usually spans a node
  boundary, and says little about the counts inside one node. (Replicas: the measured slope.)
- no measurement: the prior, (n / requested)^PRIOR_EXPONENT, and the job is not trusted
  with more than it asked for.

Rates are in reference-batch steps, and what one step at a large batch is worth grows with the
job's gradient noise scale (Pollux's statistical efficiency): a rate measured 10 minutes ago
at 16 GPUs understates what 16 GPUs give today. When the job reports its noise scale and the
batch it trains at (`sdk.GradientNoiseScale`; the simulator's jobs report the same), each
measured rate can be carried to today's noise scale before the curve is drawn (`noise_factor`;
the caller passes `noise_now` and `ref_batch` to ask for it: `sluice` with `carry_noise`, off
by default — measured in docs/policies.md).
The job's choice of a new batch at the new noise scale is not modelled: the carried rate is
what the old batch would give today, a lower bound.

Uncertainty is carried in what the model will let a policy try: never more than
`EXPLORE_FACTOR` × the most GPUs measured (Pollux uses 2×) or the job's own request, whichever
is more, so a wrong prior costs one restart at a bounded size, and its measurement then
replaces the prior. Measurements older
than `STALE_S` are dropped: goodput moves as training goes on (the gradient noise grows),
and a curve measured hours ago would pin a job at its old size. Early in training goodput
moves much faster than that (`PHASE_GROWTH`): a measurement is also dropped once the job has
gone far enough past the step it was made at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sluice.model import RateSample

PRIOR_EXPONENT = 0.8
"""Speed-up n^0.8 where nothing was measured: typical sub-linear data-parallel scaling."""

EXPLORE_FACTOR = 4
"""A job may be given at most this many times the most GPUs it has been measured at. Pollux
uses 2; on the Pollux workloads 4 measured better (0.5× load, workloads 1–3: 0.402 → 0.368 h;
1.0×, workloads 1, 2, 3, 8: 0.660 → 0.648 h), since a job starting on 1 GPU reaches its size
in fewer restarts."""

KEEP_REQUEST = True
"""The cap never falls below what the job asked for: a job placed on 1 GPU because the
cluster was full, and measured there, would otherwise be held to EXPLORE_FACTOR GPUs after
asking for 12 (0.5× load: deepspeech jobs went 1 -> 4 -> 3 -> 2 -> 3 -> 12 GPUs, where
`pollux` gave them 12 at once). The request is the user's own statement, seen by every
engine; a measurement there replaces the prior as anywhere else."""

STALE_S = 900.0
"""Measurements older than this (seconds before the newest) are not used."""

PHASE_GROWTH = 1.5
"""A measurement made at step s is from an earlier phase of training, and not used, once the
job's newest measurement was made past PHASE_GROWTH × s and at least PHASE_FRACTION of its
declared total steps further on (jobs that declare no total: only `STALE_S`).

Goodput moves with how far training has got, not with the clock, and fastest at the start,
while the gradient noise scale is small and a large batch (many GPUs) buys little: yolov3 in
its first epoch (2 % of its steps) runs slower on 4 GPUs than on 1, and 2.3× faster from the
second; deepspeech2 on 12 GPUs goes from 0.95× to 6× its 1-GPU speed over its first few
epochs. Its 1-GPU rate does not move, so a deepspeech2 job measured on its requested 12 GPUs
in epoch 0, then shrunk to 1, kept the 12-GPU point, and 1 GPU, for the whole `STALE_S`
(0.5× load, workload 5: 41 minutes where `pollux` took 24). Counted in progress, that point
goes after a 2 % step (about 4 minutes on 1 GPU for deepspeech2, 11 for yolov3); a job
measured late in training keeps `STALE_S`. `sluice` at 0.5× load: 0.354 -> 0.346 h (6 runs
with a parameter nudged: 0.342-0.348 h against 0.354-0.357 h), restarts 1550 -> 1512; 1.0×
and 1.5×: no change beyond the noise of a nudge (6 runs at 1.0×: 0.656 -> 0.654 h; 1.5×:
0.864 -> 0.865 h). `pollux` draws the same curves: 0.410 -> 0.405 h at 0.5×, 0.822 -> 0.823 h
at 1.0× (docs/policies.md, "Learned speed-up curves")."""

PHASE_FRACTION = 0.02
"""The least progress, as a share of the job's declared total steps, past the step a
measurement was made at before `PHASE_GROWTH` drops it: a job's first measurement is made a
few dozen steps in, and growth alone would drop it within a minute and explore again."""

MEASURED_SLOPE_BELOW = False
"""Scale a job's rate below the fewest GPUs it was measured at with the slope of its two
lowest measurements (True; the rule before 2026-11-26) instead of the prior exponent.
Checked against the first rate then measured at the smaller count (0.5× load, all eight
workloads, 134 such moves; `scripts/diagnose_sluice.py`): the measured slope's
measured/predicted ratio had p10 0.16, median 0.94, p90 1.63 — the two lowest measurements
were both multi-node counts in 142 of 176 moves, and their slope, clipped to 0 in 41 % of
them, made a shrink look free. The prior errs the other way with a narrow low tail (p10
0.89, median 1.53, p90 4.1): a job runs faster on fewer GPUs than n^0.8 says, so a shrink
looks dearer than it is, which costs fewer restarts than a shrink that looked free. Mean
JCT 0.5× 0.367 → 0.354 h, 1.0× 0.665 → 0.658 h, 1.5× 0.878 → 0.864 h, 2.0× 1.284 → 1.282 h,
restarts 4–8 % fewer; `pollux`, drawing the same curves, gained as much
(docs/policies.md). GPU curves only: a CPU job's replica curve (`unit="replicas"`, one
node's cores, no node boundary in it) keeps the measured slope — nothing was measured there."""


def _earlier_phase(s: RateSample, step: int | None, total_steps: int | None) -> bool:
    """Whether sample s was measured in an earlier phase of the job's training than the newest
    measurement, made at `step` (`PHASE_GROWTH`, `PHASE_FRACTION`); False where a step or the
    total is unknown. Relative to the newest measurement, as `STALE_S` is, so that one is
    always kept: against the job's latest report, a fast job's only fresh measurement was
    dropped as soon as it was made (0.5× load: mean 0.373 h, restarts 2106)."""
    if s.step is None or step is None or not total_steps or total_steps <= 0:
        return False
    return step > PHASE_GROWTH * s.step and step - s.step > PHASE_FRACTION * total_steps


def efficiency(batch: float, noise_scale: float, ref_batch: float) -> float:
    """Progress per sample at `batch` relative to `ref_batch` (Pollux's statistical efficiency,
    McCandlish et al.'s model): (B_noise + B0) / (B_noise + B). One sample at a batch far
    above the noise scale adds little, far below it nearly a whole reference sample."""
    return (noise_scale + ref_batch) / (noise_scale + batch)


def noise_factor(batch: float, then: float, now: float, ref_batch: float) -> float:
    """How much faster a job counting reference-batch steps now runs at `batch` than when its
    noise scale was `then`: the same samples per second, each worth efficiency(now) instead of
    efficiency(then). Above 1 as the noise grows (late in training), more so for larger
    batches — which is why larger allocations pay off later."""
    return efficiency(batch, now, ref_batch) / efficiency(batch, then, ref_batch)


class LearnedCurve:
    """Steps per second of one job at n units — GPUs (GPU jobs) or replicas (CPU data-parallel
    jobs) — from its own measurements."""

    def __init__(
        self,
        samples: Iterable[RateSample],
        prior_exponent: float = PRIOR_EXPONENT,
        unit: str = "gpus",
        noise_now: float | None = None,
        ref_batch: float | None = None,
        total_steps: int | None = None,
    ) -> None:
        if unit not in ("gpus", "replicas"):
            raise ValueError(f"unit must be 'gpus' or 'replicas', got {unit!r}")
        self.unit = unit
        units = {s: s.gpus if unit == "gpus" else s.replicas for s in samples}
        usable = [s for s in units if units[s] > 0 and s.steps_per_s > 0]
        newest = max((s.at for s in usable), default=0.0)
        # The step of the newest measurement (by time), not the highest step of any: a job
        # that went back in its steps (restarted without a checkpoint, or counting from 0 in
        # each attempt) would otherwise lose its fresh measurement to the old attempt's.
        latest = max(usable, key=lambda s: s.at, default=None)
        newest_step = latest.step if latest is not None else None
        by_units: dict[int, RateSample] = {}
        for s in usable:
            if s.at < newest - STALE_S or _earlier_phase(s, newest_step, total_steps):
                continue
            old = by_units.get(units[s])
            if old is None or s.at > old.at:
                by_units[units[s]] = s
        self.points: list[tuple[int, float]] = sorted(
            (n, s.steps_per_s * self._carried(s, noise_now, ref_batch)) for n, s in by_units.items()
        )
        self.prior_exponent = prior_exponent

    @staticmethod
    def _carried(s: RateSample, now: float | None, ref_batch: float | None) -> float:
        """The factor that carries sample s to today's noise scale (1 when anything needed is
        missing: a job that reports no noise scale keeps its rates as measured)."""
        if now is None or ref_batch is None or s.noise_scale is None or s.batch is None:
            return 1.0
        return noise_factor(s.batch, s.noise_scale, now, ref_batch)

    @property
    def measured(self) -> bool:
        return bool(self.points)

    @property
    def most_measured(self) -> int:
        return self.points[-1][0] if self.points else 0

    def explore_cap(self, asked: int, factor: int | None = None) -> int:
        """Most units the model is confident enough to try: `factor` × the most measured, or
        what the job asked for when nothing was measured yet. (EXPLORE_FACTOR is read at the
        call, not bound as a default, so a sweep that sets it takes effect.)"""
        factor = EXPLORE_FACTOR if factor is None else factor
        if not self.points:
            return max(asked, 1)
        return max(factor * self.most_measured, asked if KEEP_REQUEST else 1, 1)

    def _slope(self, a: tuple[int, float], b: tuple[int, float]) -> float:
        return math.log(b[1] / a[1]) / math.log(b[0] / a[0])

    def rate(self, n: int) -> float | None:
        """Predicted steps/s on n GPUs (None when nothing was measured)."""
        pts = self.points
        if not pts or n <= 0:
            return None if not pts else 0.0
        for i, (g, r) in enumerate(pts):
            if g == n:
                return r
            if g > n:
                if i == 0:
                    if (MEASURED_SLOPE_BELOW or self.unit == "replicas") and len(pts) > 1:
                        slope = min(max(self._slope(pts[0], pts[1]), 0.0), 1.0)
                    else:
                        slope = self.prior_exponent
                    return r * (n / g) ** slope
                lo = pts[i - 1]
                f = math.log(n / lo[0]) / math.log(g / lo[0])
                return math.exp(math.log(lo[1]) + f * (math.log(r) - math.log(lo[1])))
        top = pts[-1]
        slope = self._slope(pts[-2], top) if len(pts) > 1 else self.prior_exponent
        slope = min(max(slope, 0.0), 1.0)
        return top[1] * (n / top[0]) ** slope

    def speedup(self, n: int, ref: int) -> float:
        """Speed on n GPUs relative to ref GPUs (the prior curve when nothing was measured)."""
        if n <= 0:
            return 0.0
        a, b = self.rate(n), self.rate(max(ref, 1))
        if a is None or b is None or b <= 0:
            return (n / max(ref, 1)) ** self.prior_exponent
        return max(a / b, 1e-9)
