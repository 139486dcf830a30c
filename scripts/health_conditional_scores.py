"""Conditional-calibrated scores for the flow (issue 17): does scoring each step against the
flow's own conditional samples put healthy scores on one scale across servers?

    .venv/bin/python scripts/health_conditional_scores.py compute ../shared/data/anomaly/asd WORK [M [SEED]]
    .venv/bin/python scripts/health_conditional_scores.py noisy ../shared/data/anomaly/asd WORK
    .venv/bin/python scripts/health_conditional_scores.py scale ../shared/data/anomaly/asd WORK [SCORES]
    .venv/bin/python scripts/health_conditional_scores.py protocol ../shared/data/anomaly/asd WORK [K [SCORES]]

`compute`: per server, trains the flow exactly as `sluice health eval --protocol
leave-servers-out` does (default `DetectorConfig`, seed 0; the model is kept in WORK so a
re-run only samples), and for every calibration and test window draws M (64) samples from
the flow's conditional distribution given that window's history. Kept per window
(WORK/NAME.feat.npz): the observed NLL, the samples' NLL mean and std, how many samples have
an NLL at least the observed one, and each KPI's distance of the observed value from its
samples' mean in units of their spread (what `detector.attribute` computes for one window).

`noisy`: the observed windows' NLL averaged over 8 copies with the training's dequantisation
noise added (WORK/NAME.noisy.npz; score `noisy_nll`).

`scale`: per server, the share of healthy and of labelled test windows over the calibration
windows' 99th percentile, for each score.

`protocol`: every score built from those features goes through the protocol's own machinery
(`protocol.leave_servers_out` over `protocol.grid()`: smoothing x SPOT/DSPOT settings chosen
on the other folds' servers), next to the raw NLL from the same run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import average_precision_score

from sluice.health.detector import DetectorConfig, FlowDetector, smooth_scores
from sluice.health.evaluation import Entity, load_folder
from sluice.health.features import per_step, windows
from sluice.health.metrics import best_f1, f1_of
from sluice.health.protocol import FLOW, RawScores, grid, leave_servers_out, summary


def calibration_windows(det: FlowDetector, train: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows `FlowDetector.fit` calibrates on (the newest `val_fraction` of train)."""
    cfg = det.config
    assert det.scaler is not None
    hist, tgt = windows(det.scaler.transform(train), cfg.history, cfg.target)
    n_val = int(len(hist) * cfg.val_fraction) if len(hist) >= 50 else 0
    cut = len(hist) - n_val
    if n_val == 0:
        cut_tr = max(cut - cfg.history, 1)
        return torch.from_numpy(hist[:cut_tr]), torch.from_numpy(tgt[:cut_tr])
    return torch.from_numpy(hist[cut:]), torch.from_numpy(tgt[cut:])


@torch.no_grad()
def features(
    det: FlowDetector, hist: torch.Tensor, tgt: torch.Tensor, m: int, chunk: int = 256
) -> dict[str, np.ndarray]:
    assert det.net is not None
    net = det.net
    net.eval()
    out: dict[str, list[np.ndarray]] = {"nll": [], "s_mean": [], "s_std": [], "n_ge": [], "kpi_z": []}
    for i in range(0, len(hist), chunk):
        h, t = hist[i : i + chunk], tgt[i : i + chunk]
        dist = net.flow(net.context(h))
        nll = -dist.log_prob(t)  # (B,)
        draws = dist.sample((m,))  # (M, B, D)
        s_nll = -dist.log_prob(draws)  # (M, B)
        mu, sd = draws.mean(0), draws.std(0)
        out["nll"].append(nll.numpy())
        out["s_mean"].append(s_nll.mean(0).numpy())
        out["s_std"].append(s_nll.std(0).numpy())
        out["n_ge"].append((s_nll >= nll[None]).sum(0).numpy())
        out["kpi_z"].append(((t - mu).abs() / (sd + 1e-3)).numpy())
    return {k: np.concatenate(v).astype(np.float32) for k, v in out.items()}


def compute(folder: Path, work: Path, m: int, seed: int = 0) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for ent in load_folder(folder):
        dest = work / f"{ent.name}.feat.npz"
        if dest.exists():
            print(f"{ent.name}: done before")
            continue
        model = work / f"{ent.name}.pt"
        t0 = time.perf_counter()
        if model.exists():
            det = FlowDetector.load(model)
        else:
            det = FlowDetector(DetectorConfig(seed=seed))
            det.fit(ent.train)
            det.save(model)
        t1 = time.perf_counter()
        torch.manual_seed(1234)
        ch, ct = calibration_windows(det, ent.train)
        th, tt = det._windows(ent.test)
        cal = features(det, ch, ct, m)
        tes = features(det, th, tt, m)
        np.savez(
            dest,
            m=np.int64(m),
            **{f"calib_{k}": v for k, v in cal.items()},
            **{f"test_{k}": v for k, v in tes.items()},
        )
        print(f"{ent.name}: fit/load {t1 - t0:.1f}s, sampling {time.perf_counter() - t1:.1f}s", flush=True)


@torch.no_grad()
def noisy_nll(det: FlowDetector, hist: torch.Tensor, tgt: torch.Tensor, copies: int = 8) -> np.ndarray:
    """Mean NLL of `copies` copies of each window with the training's dequantisation noise
    added to history and target: the observed value scored as the model was trained to see it."""
    assert det.net is not None
    det.net.eval()
    sd = det.config.noise
    total = np.zeros(len(hist), np.float64)
    for _ in range(copies):
        total += det._nll(hist + sd * torch.randn_like(hist), tgt + sd * torch.randn_like(tgt))
    return (total / copies).astype(np.float32)


def compute_noisy(folder: Path, work: Path) -> None:
    for ent in load_folder(folder):
        det = FlowDetector.load(work / f"{ent.name}.pt")
        torch.manual_seed(4321)
        ch, ct = calibration_windows(det, ent.train)
        th, tt = det._windows(ent.test)
        np.savez(
            work / f"{ent.name}.noisy.npz",
            calib_noisy_nll=noisy_nll(det, ch, ct),
            test_noisy_nll=noisy_nll(det, th, tt),
        )
        print(f"{ent.name}: noisy NLL done", flush=True)


# --- scores built from the features -------------------------------------------------------

Feat = dict[str, np.ndarray]


def _topk_mean(z: np.ndarray, k: int) -> np.ndarray:
    return np.sort(z, axis=1)[:, -k:].mean(axis=1)


def _cal_scale(calib: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x - median) / (99th percentile - median) of the healthy calibration values."""
    med, hi = float(np.median(calib)), float(np.quantile(calib, 0.99))
    span = max(hi - med, 1e-9)
    return (calib - med) / span, (test - med) / span


def variants() -> dict[str, Callable[[Feat, str], np.ndarray]]:
    """name -> f(features, 'calib'|'test') giving one score per window (higher = worse)."""

    def nll(f: Feat, p: str) -> np.ndarray:
        return f[f"{p}_nll"]

    def excess(f: Feat, p: str) -> np.ndarray:
        return f[f"{p}_nll"] - f[f"{p}_s_mean"]

    def zscore(f: Feat, p: str) -> np.ndarray:
        return (f[f"{p}_nll"] - f[f"{p}_s_mean"]) / (f[f"{p}_s_std"] + 1e-3)

    def pval(f: Feat, p: str) -> np.ndarray:
        m = float(f["m"])
        return -np.log((1.0 + f[f"{p}_n_ge"]) / (m + 1.0))

    def kmax(f: Feat, p: str) -> np.ndarray:
        return f[f"{p}_kpi_z"].max(axis=1)

    def ktop2(f: Feat, p: str) -> np.ndarray:
        return _topk_mean(f[f"{p}_kpi_z"], 2)

    def logkmax(f: Feat, p: str) -> np.ndarray:
        return np.log1p(f[f"{p}_kpi_z"].max(axis=1))

    def kcal(f: Feat, p: str) -> np.ndarray:
        # each KPI's distance in units of its own healthy 99th percentile (calibration windows)
        ref = np.quantile(f["calib_kpi_z"], 0.99, axis=0) + 1e-3
        return f[f"{p}_kpi_z"] / ref

    def kcal_max(f: Feat, p: str) -> np.ndarray:
        return kcal(f, p).max(axis=1)

    def kcal_top2(f: Feat, p: str) -> np.ndarray:
        return _topk_mean(kcal(f, p), 2)

    def gauss_p(f: Feat, p: str) -> np.ndarray:
        # -log of the Gaussian upper tail of the z-score: an unsaturated p-value
        from scipy.stats import norm

        return -norm.logsf(zscore(f, p).astype(np.float64))

    def noisy(f: Feat, p: str) -> np.ndarray:
        return f[f"{p}_noisy_nll"]

    return {
        "noisy_nll": noisy,
        "nll": nll,
        "kcal_max": kcal_max,
        "kcal_top2": kcal_top2,
        "gauss_pvalue": gauss_p,
        "excess": excess,
        "zscore": zscore,
        "pvalue": pval,
        "kpi_max": kmax,
        "kpi_top2": ktop2,
        "log_kpi_max": logkmax,
    }


def raws_for(ents: list[Entity], feats: dict[str, Feat], score: str) -> dict[str, RawScores]:
    """`score`: a name of `variants()`, or `max:a+b` / `mean:a+b`: the named scores each put on
    their healthy calibration scale (`_cal_scale`), then combined per window."""
    fns = variants()
    out: dict[str, RawScores] = {}
    for e in ents:
        f = feats[e.name]
        if ":" in score:
            how, members = score.split(":")
            parts_c, parts_t = [], []
            for name in members.split("+"):
                c, t = _cal_scale(fns[name](f, "calib").astype(np.float64), fns[name](f, "test").astype(np.float64))
                parts_c.append(c)
                parts_t.append(t)
            pick = np.max if how == "max" else np.mean
            calib, test = pick(parts_c, axis=0), pick(parts_t, axis=0)
        else:
            calib, test = fns[score](f, "calib"), fns[score](f, "test")
        out[e.name] = RawScores(e.name, FLOW, np.asarray(calib, np.float32), np.asarray(test, np.float32), e.label, 0.0)
    return out


def ceiling(raws: dict[str, RawScores], smooth: int = 5, decay: float = 0.0) -> str:
    """The top-share ceiling of scripts/threshold_ceiling.py on these scores."""
    best, by = [], {p: [] for p in (0.01, 0.02, 0.03, 0.05, 0.10)}
    for r in raws.values():
        t = np.nan_to_num(np.asarray(per_step(smooth_scores(r.test, smooth, decay), len(r.label)), float))
        best.append(best_f1(t, r.label)[0])
        for p in by:
            by[p].append(f1_of(t > np.quantile(t, 1 - p), r.label))
    mb = float(np.mean(best))
    return " ".join(f"{p:.0%}:{np.mean(v) / mb:.2f}" for p, v in by.items())


def load_feats(work: Path, name: str) -> Feat:
    with np.load(work / f"{name}.feat.npz") as d:
        f = {key: d[key] for key in d.files}
    noisy_file = work / f"{name}.noisy.npz"
    if noisy_file.exists():
        with np.load(noisy_file) as d:
            f.update({key: d[key] for key in d.files})
    return f


def scale(folder: Path, work: Path, names: list[str]) -> None:
    """Does a score's healthy calibration carry over to the server's healthy test steps? Per
    server: the share of healthy test windows over the calibration windows' 99th percentile
    (1 % if the scale carries over) and of labelled windows over it (the recall it would buy),
    unsmoothed; and the mean AUPRC of the per-step scores (smooth 5, decay 0): how well each orders."""
    fns = variants()
    for name in names:
        fp, rc, ap = [], [], []
        for e in load_folder(folder):
            f = load_feats(work, e.name)
            c, t = fns[name](f, "calib"), fns[name](f, "test")
            y = e.label[-len(t) :].astype(bool)
            thr = np.quantile(c, 0.99)
            fp.append(float(np.mean(t[~y] > thr)))
            rc.append(float(np.mean(t[y] > thr)) if y.any() else float("nan"))
            steps = np.nan_to_num(np.asarray(per_step(smooth_scores(t, 5, 0.0), len(e.label)), float))
            ap.append(float(average_precision_score(e.label, steps)))
        print(
            f"{name:>12}: healthy test over calib q99 "
            + " ".join(f"{v:.1%}" for v in fp)
            + f" (median {np.median(fp):.1%}); labelled over it "
            + " ".join(f"{v:.0%}" for v in rc)
            + f"; AUPRC (smooth 5) mean {np.mean(ap):.3f}"
        )


def protocol(folder: Path, work: Path, k: int, only: list[str] | None = None) -> None:
    ents = list(load_folder(folder))
    feats = {e.name: load_feats(work, e.name) for e in ents}
    names = only or [*variants(), "max:zscore+kpi_max", "max:nll+kpi_max", "max:pvalue+kpi_max"]
    settings = grid()
    for label in names:
        raws = raws_for(ents, feats, label)
        res = leave_servers_out({label: raws}, {label: settings}, k)
        for r in res:
            print(
                f"  {label:>22} fold {r.fold} ({r.held_out[0]}..{r.held_out[-1]}): {r.setting.label()}; "
                f"chosen-on {r.chosen_on:.3f}; held-out best {r.mean('f1_best'):.3f} auto {r.mean('f1_auto'):.3f} "
                f"ratio {r.mean('f1_auto') / r.mean('f1_best'):.2f}"
            )
        s = summary(res)[label]
        print(
            f"{label:>24} K={k}: F1 best {s['f1_best']:.3f} auto {s['f1_auto']:.3f} ratio {s['ratio']:.2f} "
            f"P {s['precision']:.3f} R {s['recall']:.3f} | top-share ceiling {ceiling(raws)}",
            flush=True,
        )
        if k == 3:
            per = {n: o for r in res for n, o in r.per_server.items()}
            print(
                "    per server auto/best: " + " ".join(f"{n}:{per[n].f1_auto:.2f}/{per[n].f1_best:.2f}" for n in per)
            )


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    cmd, folder, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if cmd == "compute":
        compute(
            folder, work, int(sys.argv[4]) if len(sys.argv) > 4 else 64, int(sys.argv[5]) if len(sys.argv) > 5 else 0
        )
    elif cmd == "scale":
        scale(folder, work, sys.argv[4].split(",") if len(sys.argv) > 4 else ["nll", "excess", "zscore", "kpi_max"])
    elif cmd == "noisy":
        compute_noisy(folder, work)
    elif cmd == "protocol":
        protocol(
            folder,
            work,
            int(sys.argv[4]) if len(sys.argv) > 4 else 3,
            sys.argv[5].split(",") if len(sys.argv) > 5 else None,
        )
    else:
        sys.exit(__doc__)
