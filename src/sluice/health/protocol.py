"""Leave-servers-out: choose a detector's settings on some servers, report them on others.

Why: every knob of the detector and its automatic threshold (score smoothing, SPOT's risk,
DSPOT's depth, ...) chosen on the servers it is then scored on makes the score optimistic,
and a lead chosen that way did not carry over to unseen servers (issue 17). Here the servers
are split into K folds; for each fold the setting is chosen on the *other* folds' servers by
a stated criterion (highest mean automatic-threshold F1, the number that decides cordons),
and only the held-out servers' numbers are reported. Each server is held out exactly once,
so the report covers every server with a setting it never helped to choose.

Cost: a model is trained once per server and detector; the settings here act on its scores
only (smoothing of window NLLs, the threshold rule), so the whole grid reuses those scores.
They are cached on disk (`ScoreCache`), keyed by the data file and the model's settings.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from sluice.health.baselines import AutoencoderDetector, IForestDetector, PCADetector
from sluice.health.detector import DetectorConfig, FlowDetector, smooth_scores
from sluice.health.evaluation import Entity
from sluice.health.features import per_step
from sluice.health.metrics import best_f1, f1_of
from sluice.health.monitor import MonitorConfig, make_threshold
from sluice.health.spot import Spot, dspot_alarms, hysteresis

FLOW = "sluice-flow"
BASELINES = ("pca", "iforest", "autoencoder")


@dataclass
class RawScores:
    """One detector's scores on one server before any score-side setting is applied.

    For the flow, `calibration` and `test` are window NLLs (unsmoothed; the test's are
    spread onto steps after smoothing); for a baseline they are its per-step scores."""

    entity: str
    detector: str
    calibration: np.ndarray
    test: np.ndarray
    label: np.ndarray
    train_s: float

    @property
    def smoothable(self) -> bool:
        return self.detector == FLOW


def _flow_config_key(cfg: DetectorConfig) -> dict[str, object]:
    """The settings that change the trained model (smoothing does not)."""
    d = asdict(cfg)
    for k in ("smooth", "decay", "threads"):
        d.pop(k)
    if d["encoder"] == "gru":
        d.pop("encoder")  # the key of every model cached before there was a choice
    return d


class ScoreCache:
    """Raw scores per (server file, detector, model settings), as .npz files in `root`.

    The key hashes the data file's name, size and modification time with the model's
    settings, so a changed file or model retrains and a re-run of the protocol does not."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)

    def _path(self, ent: Entity, source: Path | None, detector: str, key: dict[str, object]) -> Path | None:
        if self.root is None or source is None:
            return None
        st = source.stat()
        blob = json.dumps([source.name, st.st_size, st.st_mtime_ns, detector, key], sort_keys=True)
        return self.root / f"{ent.name}.{detector}.{hashlib.sha256(blob.encode()).hexdigest()[:16]}.npz"

    def get_or_compute(
        self,
        ent: Entity,
        source: Path | None,
        detector: str,
        key: dict[str, object],
        compute: Callable[[], tuple[np.ndarray, np.ndarray, float]],
    ) -> RawScores:
        path = self._path(ent, source, detector, key)
        if path is not None and path.exists():
            with np.load(path, allow_pickle=False) as d:
                return RawScores(ent.name, detector, d["calibration"], d["test"], ent.label, float(d["train_s"]))
        calib, test, train_s = compute()
        if path is not None:
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, calibration=calib, test=test, train_s=np.float64(train_s))
            tmp.replace(path)
        return RawScores(ent.name, detector, calib, test, ent.label, train_s)


def raw_scores(
    ent: Entity,
    detector: str,
    flow: DetectorConfig,
    cache: ScoreCache,
    source: Path | None = None,
) -> RawScores:
    """Train `detector` on the server's `train` (or read its cached scores) and score `test`."""
    if detector == FLOW:

        def compute_flow() -> tuple[np.ndarray, np.ndarray, float]:
            det = FlowDetector(flow)
            t0 = time.perf_counter()
            det.fit(ent.train)
            return det.calibration_raw, det.window_nll(ent.test), time.perf_counter() - t0

        return cache.get_or_compute(ent, source, detector, _flow_config_key(flow), compute_flow)
    makers: dict[str, Callable[[], PCADetector | IForestDetector | AutoencoderDetector]] = {
        "pca": PCADetector,
        "iforest": IForestDetector,
        "autoencoder": AutoencoderDetector,
    }
    if detector not in makers:
        raise ValueError(f"detector: unknown {detector!r} (known: {FLOW}, {', '.join(makers)})")

    def compute_baseline() -> tuple[np.ndarray, np.ndarray, float]:
        det = makers[detector]()
        t0 = time.perf_counter()
        det.fit(ent.train)
        return det.calibration, det.score(ent.test), time.perf_counter() - t0

    return cache.get_or_compute(ent, source, detector, {"v": 1}, compute_baseline)


@dataclass(frozen=True)
class Setting:
    """Score-side settings: none of them needs the model retrained.

    smooth/decay: the flow's score (`detector.smooth_scores`); ignored for baselines.
    method:  `spot` (threshold fixed on the calibration scores), `dspot` (drift-aware, online),
             or either with `+hold`: once an alarm is raised it holds while the score stays
             above the calibration scores' `level` quantile (`spot.hysteresis`).
    q:       SPOT's risk; depth: DSPOT's window of recent non-alarm scores; level: SPOT's
             initial quantile (also the hold's lower threshold).
    """

    smooth: int = 5
    decay: float = 0.7
    method: str = "spot"
    q: float = 1e-3
    depth: int = 10
    level: float = 0.98

    def label(self, smoothable: bool = True) -> str:
        parts = [f"smooth={self.smooth} decay={self.decay:g}"] if smoothable else []
        parts.append(f"{self.method} q={self.q:g} level={self.level:g}")
        if self.method.startswith("dspot"):
            parts.append(f"depth={self.depth}")
        return " ".join(parts)


@dataclass
class Outcome:
    f1_best: float
    f1_auto: float
    precision: float
    recall: float
    alarm_rate: float


def apply(raw: RawScores, s: Setting) -> Outcome:
    """Best-threshold and automatic-threshold F1 of one server's scores under one setting."""
    if raw.smoothable:
        calib = smooth_scores(raw.calibration, s.smooth, s.decay)
        test = per_step(smooth_scores(raw.test, s.smooth, s.decay), len(raw.label))
    else:
        calib, test = raw.calibration, raw.test
    calib = np.asarray(calib, dtype=np.float64)
    test = np.nan_to_num(np.asarray(test, dtype=np.float64), nan=0.0, posinf=1e12, neginf=-1e12)
    method, hold = s.method.removesuffix("+hold"), s.method.endswith("+hold")
    if method == "spot":
        alarms = test > Spot(q=s.q, level=s.level).fit(calib).threshold
    elif method == "dspot":
        alarms = dspot_alarms(calib, test, q=s.q, depth=s.depth, level=s.level)
    else:
        raise ValueError(f"method: unknown {s.method!r} (spot, dspot, spot+hold, dspot+hold)")
    if hold:
        alarms = hysteresis(alarms, test, float(np.quantile(calib[np.isfinite(calib)], s.level)))
    return _outcome(raw, test, alarms)


def apply_live(raw: RawScores, config: MonitorConfig | None = None) -> Outcome:
    """The live monitor's own rule on one server's scores: the online detector's score
    smoothing and `monitor.make_threshold` (bounded SPOT or DSPOT, as `config` says),
    streamed over the test scores. Nothing here is chosen on the servers it is scored on, so
    every server's number is held-out. (The scores are the offline detector's: the rule is
    the live one, the model is not.)"""
    cfg = config or MonitorConfig()
    if raw.smoothable:
        calib = smooth_scores(raw.calibration, cfg.detector.smooth, cfg.detector.decay)
        test = per_step(smooth_scores(raw.test, cfg.detector.smooth, cfg.detector.decay), len(raw.label))
    else:
        calib, test = raw.calibration, raw.test
    calib = np.asarray(calib, dtype=np.float64)
    test = np.nan_to_num(np.asarray(test, dtype=np.float64), nan=0.0, posinf=1e12, neginf=-1e12)
    rule = make_threshold(cfg, calib)
    alarms = np.fromiter((rule.step(float(x)) for x in test), dtype=bool, count=len(test))
    return _outcome(raw, test, alarms)


def _outcome(raw: RawScores, test: np.ndarray, alarms: np.ndarray) -> Outcome:
    y = raw.label.astype(bool)
    tp = float(np.sum(alarms & y))
    return Outcome(
        f1_best=best_f1(test, raw.label)[0],
        # A server without a labelled fault has no F1 (its best F1 is NaN too): it is left out
        # of the means rather than counted as 0 for every setting; its alarm rate still shows.
        f1_auto=f1_of(alarms, raw.label) if y.any() else float("nan"),
        precision=tp / max(float(alarms.sum()), 1.0),
        recall=tp / float(y.sum()) if y.any() else float("nan"),
        alarm_rate=float(alarms.mean()),
    )


SCORE_VARIANTS: tuple[tuple[int, float], ...] = ((1, 0.0), (5, 0.0), (5, 0.7), (8, 0.0), (8, 0.7))
"""(smooth, decay) pairs of the default grid: none, a plain mean, the shipped decay, longer."""


def grid(
    scores: Sequence[tuple[int, float]] = SCORE_VARIANTS,
    spot_q: Sequence[float] = (1e-3, 1e-2),
    spot_level: Sequence[float] = (0.95, 0.98, 0.99),
    dspot_q: Sequence[float] = (1e-3, 1e-2),
    dspot_depth: Sequence[int] = (10, 100),
    hold: bool = True,
) -> list[Setting]:
    """The settings the protocol chooses among: for every score variant, fixed SPOT over
    risk x initial quantile (with and without the alarm hold) and DSPOT over risk x depth.
    Small on purpose: DSPOT refits its tail on every healthy peak, which costs about a
    second per server and setting at q = 1e-3, and a large grid gives the choosing servers
    more ways to be lucky."""
    out: dict[Setting, None] = {}
    methods = ("spot", "spot+hold") if hold else ("spot",)
    for sm, de in scores:
        for me, qq, lv in itertools.product(methods, spot_q, spot_level):
            out[Setting(sm, de, me, qq, 10, lv)] = None
        for qq, dp in itertools.product(dspot_q, dspot_depth):
            out[Setting(sm, de, "dspot", qq, dp, 0.98)] = None
    return list(out)


def folds(names: Sequence[str], k: int) -> list[list[str]]:
    """K folds of contiguous servers in the given (natural) order: omi-1..4, omi-5..8, ... for
    K = 3 — fixed, not shuffled, so a reader can re-run any fold by hand."""
    if not 2 <= k <= len(names):
        raise ValueError(f"folds: {k} must be between 2 and the number of servers ({len(names)})")
    return [list(part) for part in np.array_split(np.asarray(names, dtype=object), k)]


@dataclass
class FoldResult:
    fold: int
    held_out: list[str]
    detector: str
    setting: Setting
    chosen_on: float
    """Mean automatic F1 on the choosing servers (the criterion)."""
    per_server: dict[str, Outcome]

    def mean(self, field_name: str) -> float:
        return float(np.nanmean([getattr(o, field_name) for o in self.per_server.values()]))


def choose(table: dict[Setting, dict[str, Outcome]], servers: Iterable[str]) -> tuple[Setting, float]:
    """The setting with the highest mean automatic-threshold F1 over `servers` (ties: the
    earlier setting in grid order, i.e. the simpler one)."""
    names = list(servers)
    best: tuple[Setting, float] | None = None
    for setting, per in table.items():
        v = float(np.nanmean([per[n].f1_auto for n in names]))
        if best is None or v > best[1] + 1e-12:
            best = (setting, v)
    assert best is not None
    return best


def leave_servers_out(
    raws: dict[str, dict[str, RawScores]],
    settings: dict[str, list[Setting]],
    k: int,
    progress: Callable[[str], None] | None = None,
) -> list[FoldResult]:
    """`raws[detector][server]`; `settings[detector]`: that detector's grid. One result per
    fold and detector, its numbers from the held-out servers only."""
    out: list[FoldResult] = []
    for det, per_server in raws.items():
        names = list(per_server)
        table: dict[Setting, dict[str, Outcome]] = {}
        for i, s in enumerate(settings[det]):
            if progress is not None and i % 20 == 0:
                progress(f"{det}: setting {i + 1}/{len(settings[det])}")
            table[s] = {n: apply(per_server[n], s) for n in names}
        for f, held in enumerate(folds(names, k)):
            chosen, crit = choose(table, [n for n in names if n not in held])
            out.append(FoldResult(f + 1, held, det, chosen, crit, {n: table[chosen][n] for n in held}))
    return out


def summary(results: list[FoldResult]) -> dict[str, dict[str, float]]:
    """Per detector, means over every server as held out (each server counts once)."""
    out: dict[str, dict[str, float]] = {}
    for det in dict.fromkeys(r.detector for r in results):
        outs = [o for r in results if r.detector == det for o in r.per_server.values()]
        best = float(np.nanmean([o.f1_best for o in outs]))
        auto = float(np.nanmean([o.f1_auto for o in outs]))
        out[det] = {
            "f1_best": best,
            "f1_auto": auto,
            "ratio": auto / best if best > 0 else float("nan"),
            "precision": float(np.nanmean([o.precision for o in outs])),
            "recall": float(np.nanmean([o.recall for o in outs])),
        }
    return out


def baseline_settings(flow_grid: list[Setting]) -> list[Setting]:
    """The threshold part of the flow's grid (baselines have no score smoothing)."""
    return list(dict.fromkeys(replace(s, smooth=1, decay=0.0) for s in flow_grid))
