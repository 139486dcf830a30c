"""Progress signals derived from a job's reports, shared by every engine and policy.

The controller feeds a `ProgressTracker` per job with the engine's JobProgress/JobUsage
events and puts its `snapshot()` in the ClusterView. Policies read the snapshot; none of
them re-parses logs. Histories are bounded so a view of 20,000 jobs stays cheap.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TypeGuard

from sluice.model.allocation import Allocation

MAX_STEP = 2**53
"""The largest step (and total_steps) a job may report: exact as a JSON number and within the
store's 64-bit columns (`sluice.agent.progress_record` drops records past it)."""
HISTORY_POINTS = 240
"""Samples kept per job for loss and usage history (older points are dropped)."""

RATE_SHAPES = 32
"""Allocation shapes a job's measured rates are kept for (the oldest measurement is dropped)."""

RATE_WINDOW_S = 300.0
"""Recent span a rate is measured over, within one allocation: long enough to average out
report jitter, short enough to follow a job whose speed changes as it trains."""

NOISE_WEIGHT = 0.2
"""Weight of a report's gradient noise scale in the job's running (geometric) mean of them. An
estimate from one report is noisy (the SDK's own is an EMA of noisy per-step measurements);
the curve that uses it is redrawn every round, and a jumpy input turned into resizes
(docs/policies.md, "The gradient noise scale")."""

RESTARTS_KEPT = 8
"""Deliberate restarts (resizes, migrations) whose measured cost a job's signals keep."""

RESTART_RATE_SPAN_S = 5.0
"""A restart's cost is settled at the first report that measures the new allocation over at
least this long: the rate right after the restart, not a later one that has drifted with
training, is what the steps made across the gap are timed at."""

AllocShape = tuple[int, int, int]
"""What a job held while a rate was measured: (GPUs, nodes, replicas)."""


def alloc_shape(alloc: Allocation | None) -> AllocShape | None:
    """The shape a rate is recorded under (None: the job holds nothing)."""
    if alloc is None:
        return None
    return (alloc.total_gpus, len(alloc.nodes), len(alloc.assignments))


@dataclass(frozen=True, slots=True)
class RateSample:
    """Steps per second a job was measured at while it held one allocation shape.

    Measured between reports of the same attempt on the same shape, so start-up, restore and
    the restart itself are never counted against the allocation (a restart used to halve
    the measured rate for a minute). `seconds` is the span measured, `at` its end.
    """

    gpus: int
    nodes: int
    replicas: int
    steps_per_s: float
    seconds: float
    at: float
    noise_scale: float | None = None
    """The job's gradient noise scale (samples) when the rate was measured, if it reports one."""
    batch: float | None = None
    """The global batch (samples) the job trained at when the rate was measured, if reported."""
    step: int | None = None
    """The step the job reported at `at` (how far training had got when the rate was measured:
    `speedup.LearnedCurve` drops a measurement from an earlier phase of training)."""


@dataclass(frozen=True, slots=True)
class ProgressSignals:
    """What policies know of a job's learning, as plain values.

    loss_history:  (time s, loss / max loss so far) pairs, oldest first (FlowCon's l~).
    usage_history: (time s, CPU cores used) pairs, oldest first.
    throughput:    steps per second over the recent window (0 when unknown).
    total_steps:   the job's own statement of how many steps it will run, if it made one.
    predicted_remaining_s: remaining time from total_steps/throughput, or a fitted
                   learning curve reaching the QoE loss target; None when unknown.
    io_stall_fraction: share of wall time the job waited on data (0..1).
    report_history: (time s, step, loss or None) of each report, oldest first: the raw
                   series behind the others, for people (`sluice job plot`), not policies.
    rates:         measured steps/s at each allocation shape the job has held (RateSample),
                   what learned speedup models are fitted from.
    restart_lost_s: seconds of progress each of the job's recent deliberate restarts (a
                   resize or migration the controller carried out) cost it, measured from
                   its reports: the wall time from the last report before the restart to the
                   first after it, less the time the steps made in between take at the new
                   allocation's measured rate (steps redone after restoring an older
                   checkpoint count as lost). Oldest first; a restart shows up once the new
                   allocation has been measured over RESTART_RATE_SPAN_S, and that first rate
                   is the one used. What restart-aware policies charge a change instead of
                   an assumed constant.
    noise_scale:   the gradient noise scale (B_noise, samples) the job reports
                   (`sdk.GradientNoiseScale`: metric `grad_noise_scale`, measured at the global
                   batch `gns_batch`), a running geometric mean over its reports
                   (NOISE_WEIGHT); None if it reports none.
    ref_batch:     the batch its steps are counted in (metric `ref_batch`), when its steps are
                   reference-batch steps (progress at any batch size, in units of this batch:
                   the simulator's adaptive-batch jobs, AdaptDL-style). With noise_scale it
                   lets a learned curve carry a rate measured at an old noise scale to today's
                   (`speedup.LearnedCurve`).
    """

    step: int = 0
    loss: float | None = None
    best_loss: float | None = None
    max_loss: float | None = None
    first_report: float | None = None
    last_report: float | None = None
    throughput: float = 0.0
    total_steps: int | None = None
    predicted_remaining_s: float | None = None
    io_stall_fraction: float = 0.0
    loss_history: tuple[tuple[float, float], ...] = ()
    usage_history: tuple[tuple[float, float], ...] = ()
    report_history: tuple[tuple[float, int, float | None], ...] = ()
    rates: tuple[RateSample, ...] = ()
    restart_lost_s: tuple[float, ...] = ()
    noise_scale: float | None = None
    ref_batch: float | None = None

    def mean_loss_between(self, t0: float, t1: float) -> float | None:
        """Mean normalised loss of reports with t0 < t <= t1 (None if none)."""
        vals = [v for t, v in self.loss_history if t0 < t <= t1]
        return sum(vals) / len(vals) if vals else None

    def mean_usage_between(self, t0: float, t1: float) -> float | None:
        vals = [v for t, v in self.usage_history if t0 < t <= t1]
        return sum(vals) / len(vals) if vals else None

    @property
    def fraction_done(self) -> float | None:
        if self.total_steps:
            return min(1.0, self.step / self.total_steps)
        return None


@dataclass
class ProgressTracker:
    """Mutable accumulator owned by the controller, one per job."""

    step: int = 0
    """The furthest step any attempt reported: what the policies read (unchanged by a resume
    from an older checkpoint, as before)."""
    attempt_step: int = 0
    """The furthest step the newest attempt reported: where the job is now (what `job get`
    shows). After a crash at step 150 and a resume from the checkpoint at 69, `step` stays 150
    while this reads 69, then 70, ..."""
    _step_attempt: int = -1
    loss: float | None = None
    best_loss: float | None = None
    max_loss: float | None = None
    first_report: float | None = None
    last_report: float | None = None
    total_steps: int | None = None
    stall_s: float = 0.0
    loss_target: float | None = None
    _raw: deque[tuple[float, int, float | None]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    _usage: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    _snapshot: ProgressSignals | None = None
    _segment: tuple[AllocShape, int] | None = None
    _seg_points: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    _rates: dict[AllocShape, RateSample] = field(default_factory=dict)
    _last_point: tuple[float, int] | None = None
    _restart_pending: bool = False
    _gap: tuple[float, int, float, int] | None = None
    _restarts: deque[float] = field(default_factory=lambda: deque(maxlen=RESTARTS_KEPT))
    _noise: tuple[float, float] | None = None
    """(noise scale, batch): the running mean of the noise scales reported (NOISE_WEIGHT) and
    the batch of the latest report that carried both."""
    ref_batch: float | None = None

    def report(
        self,
        time: float,
        step: int,
        loss: float | None,
        metrics: dict[str, float] | None = None,
        shape: AllocShape | None = None,
        attempt: int = 0,
    ) -> None:
        """Take in one progress report. `shape` is what the job held when it reported (None:
        unknown, no rate is recorded); a new shape or attempt starts a new measurement whose
        first report is only its baseline."""
        self._snapshot = None
        if metrics:
            total = metrics.get("total_steps")
            if total is not None and math.isfinite(total) and 0 < total <= MAX_STEP:
                self.total_steps = int(total)
            if "stall_s" in metrics:
                self.stall_s = float(metrics["stall_s"])
            self._take_noise(metrics)
        if shape is not None:
            self._measure(time, int(step), shape, attempt)
            self._last_point = (time, int(step))
        if self.first_report is None:
            self.first_report = time
        self.last_report = time
        self.step = max(self.step, int(step))
        if attempt > self._step_attempt:
            self._step_attempt, self.attempt_step = attempt, int(step)
        elif attempt == self._step_attempt:
            self.attempt_step = max(self.attempt_step, int(step))
        if loss is not None and math.isfinite(loss):
            self.loss = float(loss)
            self.max_loss = loss if self.max_loss is None else max(self.max_loss, loss)
            self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        self._raw.append((time, int(step), loss if loss is not None and math.isfinite(loss) else None))

    def _take_noise(self, metrics: dict[str, float]) -> None:
        """The noise scale and the batch it was measured at, kept only as a pair of positive
        numbers up to MAX_NOISE_SAMPLES (a job's report is not trusted to be either)."""
        phi, batch = metrics.get("grad_noise_scale"), metrics.get("gns_batch")
        if _positive(phi) and _positive(batch):
            if self._noise is not None:
                phi = math.exp((1 - NOISE_WEIGHT) * math.log(self._noise[0]) + NOISE_WEIGHT * math.log(phi))
            self._noise = (phi, batch)
        ref = metrics.get("ref_batch")
        if _positive(ref):
            self.ref_batch = ref

    def restarting(self) -> None:
        """The controller is restarting the job on purpose (a resize or a migration): the
        gap between its last report and the first one of the next segment is a restart's
        cost, to be measured (`restart_lost_s`). Failures and preemptions are not marked:
        their gaps hold crash detection or time in the queue, not what a change costs."""
        self._snapshot = None
        self._restart_pending = True

    def _measure(self, time: float, step: int, shape: AllocShape, attempt: int) -> None:
        if self._segment != (shape, attempt):
            # A restart's gap: (t0, s0) the report before it, (t1, s1) the first after it. A
            # gap left unsettled by an earlier segment is dropped with it.
            self._gap = None
            if self._restart_pending and self._last_point is not None:
                self._gap = (*self._last_point, time, step)
            self._restart_pending = False
            self._segment = (shape, attempt)
            self._seg_points.clear()
            self._seg_points.append((time, step))
            return
        pts = self._seg_points
        if time <= pts[-1][0]:
            return
        # From the oldest kept point inside the window to this report. Points are kept at
        # least RATE_WINDOW_S / maxlen apart, so the window is measured in seconds whatever
        # the job's report rate: a job reporting 30 times a second once kept only its last
        # 2 s, never reached MIN_MEASURED_S and was never resized (`bench elastic`, 645 steps/s).
        start = next((q for q in pts if q[0] >= time - RATE_WINDOW_S), pts[-1])
        if time - pts[-1][0] >= RATE_WINDOW_S / (pts.maxlen or 1):
            pts.append((time, step))
        span = time - start[0]
        rate = max(0.0, (step - start[1]) / span)
        self._rates.pop(shape, None)
        phi, batch = self._noise if self._noise is not None else (None, None)
        self._rates[shape] = RateSample(shape[0], shape[1], shape[2], rate, span, time, phi, batch, step)
        while len(self._rates) > RATE_SHAPES:
            del self._rates[next(iter(self._rates))]
        if self._gap is not None and rate > 0 and span >= RESTART_RATE_SPAN_S:
            t0, s0, t1, s1 = self._gap
            self._restarts.append(max(0.0, (t1 - t0) - (s1 - s0) / rate))
            self._gap = None

    def _segment_rate(self) -> float | None:
        """The current allocation's measured rate; right after a change, before the new shape
        is measured, the last one measured on that shape or else on any shape."""
        if self._segment is None or not self._rates:
            return None
        r = self._rates.get(self._segment[0])
        if r is None:
            r = max(self._rates.values(), key=lambda x: x.at)
        return r.steps_per_s

    def usage(self, time: float, cores: float) -> None:
        self._snapshot = None
        self._usage.append((time, max(0.0, float(cores))))

    def _throughput(self) -> float:
        pts = [(t, s) for t, s, _ in self._raw]
        if len(pts) < 2:
            return 0.0
        t_end = pts[-1][0]
        window = [p for p in pts if p[0] >= t_end - 60.0] or pts
        if len(window) < 2:
            window = pts[-2:]
        dt = window[-1][0] - window[0][0]
        return (window[-1][1] - window[0][1]) / dt if dt > 0 else 0.0

    def snapshot(self) -> ProgressSignals:
        if self._snapshot is not None:
            return self._snapshot
        seg = self._segment_rate()
        thr = seg if seg is not None else self._throughput()
        remaining: float | None = None
        if self.total_steps and thr > 0:
            remaining = max(0.0, (self.total_steps - self.step) / thr)
        elif self.loss_target is not None and thr > 0:
            remaining = predict_steps_to_loss(
                [(s, loss) for _, s, loss in self._raw if loss is not None], self.loss_target
            )
            remaining = None if remaining is None else remaining / thr
        span = (self.last_report or 0.0) - (self.first_report or 0.0)
        stall = min(1.0, self.stall_s / span) if span > 0 else 0.0
        mx = self.max_loss
        hist = tuple((t, (loss / mx) if mx and mx > 0 else loss) for t, _, loss in self._raw if loss is not None)
        self._snapshot = ProgressSignals(
            step=self.step,
            loss=self.loss,
            best_loss=self.best_loss,
            max_loss=self.max_loss,
            first_report=self.first_report,
            last_report=self.last_report,
            throughput=thr,
            total_steps=self.total_steps,
            predicted_remaining_s=remaining,
            io_stall_fraction=stall,
            loss_history=hist,
            usage_history=tuple(self._usage),
            report_history=tuple(self._raw),
            rates=tuple(self._rates.values()),
            restart_lost_s=tuple(self._restarts),
            noise_scale=None if self._noise is None else self._noise[0],
            ref_batch=self.ref_batch,
        )
        return self._snapshot


MAX_NOISE_SAMPLES = 1e12
"""Largest noise scale or batch (samples) a report may state: far above any real job, low
enough that the efficiency arithmetic on it cannot overflow (a job's report is not trusted)."""


def _positive(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x) and 0 < x <= MAX_NOISE_SAMPLES


def predict_steps_to_loss(points: list[tuple[int, float]], target: float) -> float | None:
    """Steps still needed to reach `target`, from an Optimus-style fit loss = 1/(a*k + b) + c.

    Fitted by least squares over a grid of the asymptote c (the model is linear in a, b
    once c is fixed, via 1/(loss - c) = a*k + b). Returns None when the fit says the target
    is never reached or there are too few points — or when the job's losses (its own word,
    finite but as large or small as a float goes) make the arithmetic overflow.
    """
    try:
        steps = _steps_to_loss(points, target)
    except (OverflowError, ZeroDivisionError):
        return None
    return steps if steps is None or math.isfinite(steps) else None


def _steps_to_loss(points: list[tuple[int, float]], target: float) -> float | None:
    if len(points) < 5:
        return None
    ks = [float(k) for k, _ in points]
    ls = [float(v) for _, v in points]
    lo = min(ls)
    if lo <= target:
        return 0.0
    best: tuple[float, float, float, float] | None = None
    for frac in (0.0, 0.25, 0.5, 0.75, 0.9, 0.97):
        c = frac * lo
        ys = [1.0 / (v - c) for v in ls]
        n = len(ks)
        mk, my = sum(ks) / n, sum(ys) / n
        sxx = sum((k - mk) ** 2 for k in ks)
        if sxx <= 0:
            return None
        a = sum((k - mk) * (y - my) for k, y in zip(ks, ys, strict=True)) / sxx
        b = my - a * mk
        err = sum((1.0 / (a * k + b) + c - v) ** 2 for k, v in zip(ks, ls, strict=True) if a * k + b > 0)
        if best is None or err < best[0]:
            best = (err, a, b, c)
    assert best is not None
    _, a, b, c = best
    if a <= 0 or target <= c:
        return None
    k_target = (1.0 / (target - c) - b) / a
    return max(0.0, k_target - ks[-1])
