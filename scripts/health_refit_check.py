"""Does learning during the test period, as the live monitor does ("Learning keeps going",
docs/health.md), fix the drift that costs the flow's automatic threshold on ASD (issue 17)?

    .venv/bin/python scripts/health_refit_check.py ../shared/data/anomaly/asd MODELS_DIR OUT_DIR [BLOCK] [EPOCHS]

MODELS_DIR: the seed-0 models `scripts/health_conditional_scores.py compute` saved (the same
model `sluice health eval --protocol leave-servers-out` trains). The test series is scored in
blocks of BLOCK (288 = one day of ASD's 5-minute samples) steps, each by the model as it was
before the block (causal); after each block the model is fine-tuned for EPOCHS (2) epochs on
the newest 8,640 windows of its history: the training windows plus the test windows it
accepted as healthy — those whose NLL stayed under the 99th percentile of the first model's
healthy calibration NLLs, less 5 windows either side of any that did not (the live monitor
drops the samples leading up to an alarm). No label is read. The refitted scores then go
through the protocol's 80-setting grid (calibration: the first model's), beside the scores
of the model that never refits.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from sluice.health.detector import FlowDetector
from sluice.health.evaluation import load_folder
from sluice.health.features import windows
from sluice.health.protocol import FLOW, RawScores, grid, leave_servers_out, summary

HISTORY_WINDOWS = 8640


def fine_tune(det: FlowDetector, hist: torch.Tensor, tgt: torch.Tensor, epochs: int, rng: np.random.Generator) -> None:
    assert det.net is not None
    cfg = det.config
    net = det.net
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr / 4, weight_decay=1e-5)
    net.train()
    for _ in range(epochs):
        order = torch.from_numpy(rng.permutation(len(hist)))
        for i in range(0, len(order), cfg.batch):
            idx = order[i : i + cfg.batch]
            h = hist[idx] + cfg.noise * torch.randn_like(hist[idx])
            t = tgt[idx] + cfg.noise * torch.randn_like(tgt[idx])
            loss = net.nll(h, t).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 5.0)
            opt.step()
    net.eval()


def refit_scores(
    det: FlowDetector, train: np.ndarray, test: np.ndarray, block: int, epochs: int
) -> tuple[np.ndarray, float]:
    assert det.scaler is not None
    torch.manual_seed(7)
    rng = np.random.default_rng(7)
    cfg = det.config
    tr_h, tr_t = (torch.from_numpy(a) for a in windows(det.scaler.transform(train), cfg.history, cfg.target))
    te_h, te_t = (torch.from_numpy(a) for a in windows(det.scaler.transform(test), cfg.history, cfg.target))
    accept_thr = float(np.quantile(det.calibration_raw, 0.99))
    nll = np.empty(len(te_h), np.float32)
    accepted = np.zeros(len(te_h), bool)
    for start in range(0, len(te_h), block):
        stop = min(start + block, len(te_h))
        nll[start:stop] = det._nll(te_h[start:stop], te_t[start:stop])
        bad = nll[start:stop] > accept_thr
        near = np.convolve(bad.astype(float), np.ones(11), mode="same") > 0
        accepted[start:stop] = ~near
        if stop == len(te_h):
            break
        idx = np.flatnonzero(accepted[:stop])
        h = torch.cat([tr_h, te_h[idx]])[-HISTORY_WINDOWS:]
        t = torch.cat([tr_t, te_t[idx]])[-HISTORY_WINDOWS:]
        fine_tune(det, h, t, epochs, rng)
    return nll, float(accepted.mean())


def report(label: str, raws: dict[str, RawScores]) -> None:
    res = leave_servers_out({label: raws}, {label: grid()}, 3)
    for r in res:
        print(
            f"  {label} fold {r.fold}: {r.setting.label()}; chosen-on {r.chosen_on:.3f}; held-out best "
            f"{r.mean('f1_best'):.3f} auto {r.mean('f1_auto'):.3f} ratio {r.mean('f1_auto') / r.mean('f1_best'):.2f}"
        )
    s = summary(res)[label]
    per = {n: o for r in res for n, o in r.per_server.items()}
    print(
        f"{label} K=3: F1 best {s['f1_best']:.3f} auto {s['f1_auto']:.3f} ratio {s['ratio']:.2f} "
        f"P {s['precision']:.3f} R {s['recall']:.3f}\n    per server auto/best: "
        + " ".join(f"{n}:{o.f1_auto:.2f}/{o.f1_best:.2f}" for n, o in per.items()),
        flush=True,
    )


def main() -> None:
    folder, models, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    block = int(sys.argv[4]) if len(sys.argv) > 4 else 288
    epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # as the detector fits (DetectorConfig.threads)
    ents = list(load_folder(folder))
    static, refit = {}, {}
    for e in ents:
        det = FlowDetector.load(models / f"{e.name}.pt")
        cache = out / f"{e.name}.b{block}.e{epochs}.npz"
        # the calibration NLLs before smoothing: the saved model keeps the smoothed ones only
        with np.load(models / f"{e.name}.feat.npz") as f:
            calib = f["calib_nll"]
        det.calibration_raw = calib
        static_test = det.window_nll(e.test)
        if cache.exists():
            with np.load(cache) as d:
                test, share = d["test"], float(d["accepted"])
        else:
            t0 = time.perf_counter()
            test, share = refit_scores(det, e.train, e.test, block, epochs)
            np.savez(cache, test=test, accepted=np.float64(share))
            print(
                f"{e.name}: refitted in {time.perf_counter() - t0:.0f}s, {share:.1%} of test windows learned",
                flush=True,
            )
        static[e.name] = RawScores(e.name, FLOW, calib, static_test, e.label, 0.0)
        refit[e.name] = RawScores(e.name, FLOW, calib, test, e.label, 0.0)
    report("no refit", static)
    report(f"refit every {block} steps, {epochs} epochs", refit)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main()
