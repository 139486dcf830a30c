"""Choose the flow's MODEL settings by the leave-servers-out protocol too (issue 17).

`sluice health eval --protocol leave-servers-out` chooses only score-side settings (smoothing
and the threshold rule), because a model setting means retraining every server. This script
does retrain: every server once per (model setting, seed), cached in CACHE_DIR by the same
`ScoreCache` keys as the command (the shipped model's scores are shared with it). Then, per
seed and per held-out fold, (model setting x score setting) is chosen *jointly* on the other
folds' servers by mean automatic-threshold F1 (ties: the earlier model, the earlier score
setting), and only the held-out servers' numbers are reported:

    nice -n 10 .venv/bin/python scripts/health_model_protocol.py ../shared/data/anomaly/asd CACHE_DIR \\
        [--seeds 0,1,2] [--folds 3] [--reference target=1] [--model noise=0.2 --model history=32,hidden=32 ...]

MODEL: comma-separated DetectorConfig fields (history, hidden, transforms, noise, epochs,
target, encoder, ...), applied on top of the reference model. The reference (`--reference`,
also fields on top of DetectorConfig()) is the first entry and the one every "reference" line
compares with; by default it is the detector shipped before this script (target 1, i.e.
DetectorConfig(target=1) since the default became 4). Without --model the grid is the
reference plus noise 0.2 and 0.5, history 32, hidden 32, target 4 and 8, and target 4 with
noise 0.2. Settings that give the same model as an earlier one are dropped.

Prints, in one run:
1. each model setting alone (score setting chosen by the protocol, as the command does): per
   seed the held-out mean best F1, automatic F1 and automatic/best, and their means over seeds;
2. the joint choice, per seed: per fold the chosen model + score setting, its criterion on the
   choosing servers, the held-out best F1, automatic F1 and ratio, then the held-out means, and
   the reference model's per-fold rows and means beside them;
3. the joint choice with the criterion averaged over the seeds (one choice per fold for all
   seeds, so a model is not chosen for one seed's luck), held-out means per seed and overall.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

from sluice.health.detector import DetectorConfig
from sluice.health.evaluation import load_folder
from sluice.health.protocol import (
    FLOW,
    Outcome,
    RawScores,
    ScoreCache,
    Setting,
    _flow_config_key,
    apply,
    folds,
    grid,
    raw_scores,
)

REFERENCE = "target=1"
DEFAULT_MODELS = ("noise=0.2", "noise=0.5", "history=32", "hidden=32", "target=4", "target=8", "target=4,noise=0.2")

Table = dict[Setting, dict[str, Outcome]]


def parse_model(spec: str) -> dict[str, object]:
    """'noise=0.2,hidden=32' -> {'noise': 0.2, 'hidden': 32}, typed as DetectorConfig's fields."""
    types = {f.name: f.type for f in fields(DetectorConfig)}
    out: dict[str, object] = {}
    for part in filter(None, spec.split(",")):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in types or key in ("seed", "smooth", "decay", "threads"):
            raise SystemExit(f"--model: {key!r} is not a model setting of DetectorConfig")
        kind = types[key]
        out[key] = int(value) if kind in (int, "int") else float(value) if kind in (float, "float") else value
    DetectorConfig(**out)  # type: ignore[arg-type]  # validates
    return out


def label(model: dict[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in model.items())


def held_out(table: Table, setting: Setting, servers: list[str]) -> tuple[float, float]:
    best = float(np.nanmean([table[setting][n].f1_best for n in servers]))
    auto = float(np.nanmean([table[setting][n].f1_auto for n in servers]))
    return best, auto


def crit(table: Table, setting: Setting, servers: list[str]) -> float:
    return float(np.nanmean([table[setting][n].f1_auto for n in servers]))


def joint_choice(tables: dict[str, Table], choosing: list[str]) -> tuple[str, Setting, float]:
    """The (model, score setting) with the highest mean automatic F1 on `choosing`; ties go
    to the earlier model (the reference first) and the earlier score setting."""
    best: tuple[str, Setting, float] | None = None
    for m, table in tables.items():
        for s in table:
            v = crit(table, s, choosing)
            if best is None or v > best[2] + 1e-12:
                best = (m, s, v)
    assert best is not None
    return best


def fmt(best: float, auto: float) -> str:
    return f"best {best:.3f} auto {auto:.3f} ratio {auto / best:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("cache", type=Path)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--reference", default=REFERENCE, help="the model to compare with (DetectorConfig fields)")
    ap.add_argument("--model", action="append", help="comma-separated DetectorConfig fields (repeatable)")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    ref = parse_model(args.reference)
    models: dict[str, dict[str, object]] = {f"reference ({label(ref) or 'DetectorConfig()'})": ref}
    seen = [_flow_config_key(DetectorConfig(**ref))]  # type: ignore[arg-type]
    for spec in args.model or DEFAULT_MODELS:
        fields_ = {**ref, **parse_model(spec)}
        ck = _flow_config_key(DetectorConfig(**fields_))  # type: ignore[arg-type]
        if ck not in seen:
            seen.append(ck)
            models[label(parse_model(spec))] = fields_
    refname = next(iter(models))
    ents = list(load_folder(args.folder))
    names = [e.name for e in ents]
    parts = folds(names, args.folds)
    store = ScoreCache(args.cache)
    settings = grid()

    # tables[seed][model][setting][server]
    tables: dict[int, dict[str, Table]] = {}
    t_start = time.perf_counter()
    for seed in seeds:
        tables[seed] = {}
        for m, spec in models.items():
            t0 = time.perf_counter()
            cfg = DetectorConfig(seed=seed, **spec)  # type: ignore[arg-type]
            raws: dict[str, RawScores] = {
                e.name: raw_scores(e, FLOW, cfg, store, args.folder / f"{e.name}.npz") for e in ents
            }
            tables[seed][m] = {s: {n: apply(raws[n], s) for n in names} for s in settings}
            train_s = sum(r.train_s for r in raws.values())
            print(
                f"# seed {seed} {m}: training {train_s:.0f} s (cached or not), "
                f"this step {time.perf_counter() - t0:.0f} s",
                flush=True,
            )

    print(f"\n== 1. each model alone, score setting chosen per fold on the other folds (K={args.folds})")
    print(f"{'model':<24}" + "".join(f"{'seed ' + str(s):>26}" for s in seeds) + f"{'mean over seeds':>30}")
    for m in models:
        cells, bs, aus, rs = [], [], [], []
        for seed in seeds:
            t = tables[seed][m]
            outs: list[Outcome] = []
            for held in parts:
                s, _ = joint_choice({m: t}, [n for n in names if n not in held])[1:]
                outs += [t[s][n] for n in held]
            b = float(np.nanmean([o.f1_best for o in outs]))
            a = float(np.nanmean([o.f1_auto for o in outs]))
            bs.append(b)
            aus.append(a)
            rs.append(a / b)
            cells.append(f"{b:.3f}/{a:.3f}/{a / b:.2f}")
        print(
            f"{m:<24}"
            + "".join(f"{c:>26}" for c in cells)
            + f"{np.mean(bs):>12.3f}/{np.mean(aus):.3f}/{np.mean(rs):.2f}"
            + f" (auto {min(aus):.3f}-{max(aus):.3f})"
        )
    print("(cells: held-out best F1 / automatic F1 / automatic/best)")

    print("\n== 2. joint choice of model x score setting, per seed")
    totals: dict[str, list[tuple[float, float]]] = {"joint": [], "reference": []}
    for seed in seeds:
        print(f"seed {seed}:")
        per_run: dict[str, list[Outcome]] = {"joint": [], "reference": []}
        for f, held in enumerate(parts, 1):
            choosing = [n for n in names if n not in held]
            m, s, v = joint_choice(tables[seed], choosing)
            dm, ds, dv = joint_choice({refname: tables[seed][refname]}, choosing)
            for key, mm, ss, vv in (("joint", m, s, v), ("reference", dm, ds, dv)):
                t = tables[seed][mm]
                per_run[key] += [t[ss][n] for n in held]
                print(
                    f"  fold {f} ({held[0]}..{held[-1]}) {key:>9}: {mm} | {ss.label()} | "
                    f"choosing {vv:.3f} | held-out {fmt(*held_out(t, ss, held))}"
                )
        for key, outs in per_run.items():
            b = float(np.nanmean([o.f1_best for o in outs]))
            a = float(np.nanmean([o.f1_auto for o in outs]))
            totals[key].append((b, a))
            print(f"  seed {seed} {key:>9} held-out means: {fmt(b, a)}")
    for key, vals in totals.items():
        b, a = float(np.mean([x[0] for x in vals])), float(np.mean([x[1] for x in vals]))
        r = float(np.mean([x[1] / x[0] for x in vals]))
        print(
            f"{key:>9} over seeds {','.join(map(str, seeds))}: best {b:.3f} auto {a:.3f} ratio {r:.2f} "
            f"(auto per seed {' '.join(f'{x[1]:.3f}' for x in vals)}; "
            f"ratio {' '.join(f'{x[1] / x[0]:.2f}' for x in vals)})"
        )

    print("\n== 3. joint choice, criterion averaged over the seeds (one choice per fold)")
    per_seed: dict[int, list[Outcome]] = {s: [] for s in seeds}
    for f, held in enumerate(parts, 1):
        choosing = [n for n in names if n not in held]
        best: tuple[str, Setting, float] | None = None
        for m in models:
            for s in settings:
                v = float(np.mean([crit(tables[seed][m], s, choosing) for seed in seeds]))
                if best is None or v > best[2] + 1e-12:
                    best = (m, s, v)
        assert best is not None
        m, s, v = best
        for seed in seeds:
            per_seed[seed] += [tables[seed][m][s][n] for n in held]
        hb = float(np.mean([held_out(tables[seed][m], s, held)[0] for seed in seeds]))
        ha = float(np.mean([held_out(tables[seed][m], s, held)[1] for seed in seeds]))
        print(f"  fold {f} ({held[0]}..{held[-1]}): {m} | {s.label()} | choosing {v:.3f} | held-out {fmt(hb, ha)}")
    vals = [
        (float(np.nanmean([o.f1_best for o in o_])), float(np.nanmean([o.f1_auto for o in o_])))
        for o_ in per_seed.values()
    ]
    print(
        f"seed-averaged choice: best {np.mean([x[0] for x in vals]):.3f} auto {np.mean([x[1] for x in vals]):.3f} "
        f"ratio {np.mean([x[1] / x[0] for x in vals]):.2f} (auto per seed {' '.join(f'{x[1]:.3f}' for x in vals)})"
    )
    print(f"# wall {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
