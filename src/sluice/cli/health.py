"""`sluice health ...`: Node health: anomaly detection models and their offline evaluation."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from sluice.health.detector import DetectorConfig
    from sluice.health.protocol import RawScores

app = typer.Typer(help="Node health: anomaly detection models and their offline evaluation.", no_args_is_help=True)

_HEAD = ("F1 best", "F1 SPOT", "F1 DSPOT", "F1 PA", "F1 PA%20", "AUROC", "AUPRC", "train s", "windows/s")


def _fmt(v: float, metric: str) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "-"
    if metric == "windows_per_s":
        return f"{v:,.0f}"
    if metric == "train_s":
        return f"{v:.1f}"
    return f"{v:.3f}"


@app.command("eval")
def eval_cmd(
    folder: Annotated[Path, typer.Argument(help="Folder of NAME.npz files with train, test, test_label.")],
    entities: Annotated[
        str | None, typer.Option(help="Comma-separated entity names (file stems) to evaluate; default all.")
    ] = None,
    baselines: Annotated[bool, typer.Option(help="Also run PCA, Isolation Forest and an autoencoder.")] = True,
    epochs: Annotated[int, typer.Option(min=1, help="Training epochs of the flow detector.")] = 12,
    max_train_s: Annotated[float, typer.Option(min=1, help="Cap on the flow's training seconds per entity.")] = 100.0,
    encoder: Annotated[
        str,
        typer.Option(
            help="The flow's history encoder: 'gru' (one GRU over the KPI vectors) or 'graph' (a GRU per KPI, "
            "then attention between KPIs: a dynamic graph per window)."
        ),
    ] = "gru",
    seed: Annotated[
        int, typer.Option(min=0, max=2**31 - 1, help="Seed of the flow's initialisation and batch order [0].")
    ] = 0,
    q: Annotated[
        float | None,
        typer.Option(
            min=1e-9, max=0.5, help="SPOT risk: healthy exceedance probability [1e-2, chosen leave-servers-out on ASD]."
        ),
    ] = None,
    smooth: Annotated[
        int | None, typer.Option(min=1, help="Flow score: weighted mean of the newest windows [8, chosen on ASD].")
    ] = None,
    decay: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Flow score: weight of the newest window (0 = equal weights) [0.7]."),
    ] = None,
    dspot_depth: Annotated[
        int | None, typer.Option(min=1, help="Drift-aware SPOT: mean of this many newest non-alarm scores [10].")
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write every row to this JSON file.")] = None,
    protocol: Annotated[
        str,
        typer.Option(
            help="'fixed': the given settings on every server. 'leave-servers-out': choose the score and "
            "threshold settings on the other folds' servers, report each fold's held-out servers only."
        ),
    ] = "fixed",
    folds: Annotated[int | None, typer.Option(min=2, help="Folds of servers for leave-servers-out [3].")] = None,
    cache: Annotated[
        Path | None,
        typer.Option(help="leave-servers-out: keep each server's raw scores here, so a re-run does not retrain."),
    ] = None,
) -> None:
    """Score the flow detector and baselines on every entity; print per entity and averaged.

    Point-adjusted F1 (PA) is inflated — a segment counts as found if one point is flagged —
    so read it beside the point-wise F1, PA%K and AUPRC.
    """
    from sluice.health.detector import ENCODERS, DetectorConfig
    from sluice.health.evaluation import (
        EVAL_DECAY,
        EVAL_DSPOT_DEPTH,
        EVAL_Q,
        EVAL_SMOOTH,
        METRICS,
        DatasetError,
        average,
        contenders,
        evaluate_entity,
        load_folder,
    )

    console = Console()
    only = [e.strip() for e in entities.split(",") if e.strip()] if entities else None
    if encoder not in ENCODERS:
        console.print(f"[red]error:[/red] --encoder: {encoder!r} is not one of {', '.join(ENCODERS)}")
        raise typer.Exit(2)
    if protocol not in ("fixed", "leave-servers-out"):
        console.print(f"[red]error:[/red] --protocol: {protocol!r} is not 'fixed' or 'leave-servers-out'")
        raise typer.Exit(2)
    if protocol == "leave-servers-out":
        given = [
            f
            for f, v in (("--q", q), ("--smooth", smooth), ("--decay", decay), ("--dspot-depth", dspot_depth))
            if v is not None
        ]
        if given:
            console.print(
                f"[red]error:[/red] {', '.join(given)}: chosen per fold by the leave-servers-out protocol; leave it out"
            )
            raise typer.Exit(2)
        _leave_servers_out(
            console,
            folder,
            only,
            baselines,
            DetectorConfig(epochs=epochs, max_train_s=max_train_s, encoder=encoder, seed=seed),
            folds or 3,
            cache,
            json_out,
        )
        return
    if folds is not None or cache is not None:
        flag = "--folds" if folds is not None else "--cache"
        console.print(f"[red]error:[/red] {flag}: only used with --protocol leave-servers-out")
        raise typer.Exit(2)
    q = EVAL_Q if q is None else q
    makers = contenders(
        DetectorConfig(
            epochs=epochs,
            max_train_s=max_train_s,
            encoder=encoder,
            seed=seed,
            smooth=EVAL_SMOOTH if smooth is None else smooth,
            decay=EVAL_DECAY if decay is None else decay,
        ),
        baselines=baselines,
    )
    rows = []
    try:
        ents = list(load_folder(folder, only))
    except DatasetError as err:
        console.print(f"[red]error:[/red] folder: {err}")
        raise typer.Exit(2) from None
    lines: list[tuple[str, str, list[str]] | None] = []  # entity, detector, a cell per metric; None: a section
    with console.status("evaluating") as status:
        for ent in ents:
            for name, make in makers.items():
                status.update(f"{ent.name}: {name}")
                row = evaluate_entity(
                    ent, name, make, q=q, dspot_depth=EVAL_DSPOT_DEPTH if dspot_depth is None else dspot_depth
                )
                rows.append(row)
                d = row.as_dict()
                lines.append((ent.name, name, [_fmt(float(d[m]), m) for m in METRICS]))  # type: ignore[arg-type]
            lines.append(None)
    means = average(rows)
    for det, avg in means.items():
        lines.append(("[b]mean[/b]", f"[b]{det}[/b]", [_fmt(avg[m], m) for m in METRICS]))
    for t in _eval_tables(console, f"sluice health eval {folder}", lines):
        console.print(t)
    console.print("note: point-adjusted F1 (F1 PA) is inflated; compare detectors on F1 best and AUPRC.")
    for det, avg in means.items():
        best = max(avg["f1_best"], 1e-12)
        console.print(
            f"{det}: automatic threshold F1 / best-threshold F1: SPOT {avg['f1_spot'] / best:.2f}, "
            f"drift-aware SPOT {avg['f1_dspot'] / best:.2f} (goal >= 0.80)"
        )
    if json_out is not None:
        json_out.write_text(json.dumps({"rows": [r.as_dict() for r in rows], "mean": average(rows)}, indent=1))


_SPLIT = (("F1 best", "F1 SPOT", "F1 DSPOT", "AUROC", "AUPRC"), ("F1 PA", "F1 PA%20", "train s", "windows/s"))
"""The metrics of `health eval` in two tables when one is too wide for the terminal: the point-wise
scores to compare detectors on, then the inflated point-adjusted ones and the costs."""


def _eval_tables(console: Console, title: str, lines: list[tuple[str, str, list[str]] | None]) -> list[Table]:
    """The evaluation as one table, or as two (`_SPLIT`) when one would not fit the console's
    width: numbers are never cut (their columns do not wrap), names fold onto more lines."""

    def build(heads: tuple[str, ...], caption: str) -> Table:
        t = Table(title=caption)
        t.add_column("entity", overflow="fold")
        t.add_column("detector", overflow="fold")
        for h in heads:
            t.add_column(h, justify="right", no_wrap=True)
        keep = [_HEAD.index(h) for h in heads]
        for line in lines:
            if line is None:
                t.add_section()
            else:
                t.add_row(line[0], line[1], *(line[2][i] for i in keep))
        return t

    whole = build(_HEAD, title)
    natural = console.measure(whole, options=console.options.update_width(10_000)).maximum
    if natural <= console.width:
        return [whole]
    return [
        build(_SPLIT[0], f"{title}: point-wise F1, ranking"),
        build(_SPLIT[1], f"{title}: point-adjusted F1 (inflated), cost"),
    ]


def _leave_servers_out(
    console: Console,
    folder: Path,
    only: list[str] | None,
    baselines: bool,
    flow: DetectorConfig,
    k: int,
    cache_dir: Path | None,
    json_out: Path | None,
) -> None:
    """`health eval --protocol leave-servers-out`: see `sluice.health.protocol`."""
    import numpy as np

    from sluice.health.evaluation import DatasetError, load_folder
    from sluice.health.protocol import (
        BASELINES,
        FLOW,
        ScoreCache,
        apply_live,
        baseline_settings,
        grid,
        leave_servers_out,
        raw_scores,
        summary,
    )

    try:
        ents = list(load_folder(folder, only))
    except DatasetError as err:
        console.print(f"[red]error:[/red] folder: {err}")
        raise typer.Exit(2) from None
    if not 2 <= k <= len(ents):
        console.print(f"[red]error:[/red] --folds: {k} needs between 2 and {len(ents)} (the servers) folds")
        raise typer.Exit(2)
    dets = [FLOW, *(BASELINES if baselines else ())]
    store = ScoreCache(cache_dir)
    raws: dict[str, dict[str, RawScores]] = {d: {} for d in dets}
    with console.status("training") as status:
        for ent in ents:
            for d in dets:
                status.update(f"{ent.name}: {d} (train or read cache)")
                raws[d][ent.name] = raw_scores(ent, d, flow, store, folder / f"{ent.name}.npz")
        flow_grid = grid()
        settings = {d: flow_grid if d == FLOW else baseline_settings(flow_grid) for d in dets}
        results = leave_servers_out(raws, settings, k, progress=status.update)
    table = Table(title=f"leave-servers-out, {k} folds: settings chosen on the other folds, scored on the held-out")
    # Numbers and detector names never break; at 80 columns only the servers and settings wrap.
    for h in (
        "fold",
        "held out",
        "detector",
        "chosen setting",
        "auto F1\n(choosing)",
        "F1\nbest",
        "F1\nauto",
        "auto/\nbest",
    ):
        text = h in ("held out", "chosen setting")
        table.add_column(h, justify="left" if text or h == "detector" else "right", no_wrap=not text, overflow="fold")
    for r in sorted(results, key=lambda r: (r.fold, dets.index(r.detector))):
        best, auto = r.mean("f1_best"), r.mean("f1_auto")
        table.add_row(
            str(r.fold),
            ",".join(r.held_out),
            r.detector,
            r.setting.label(r.detector == FLOW),
            f"{r.chosen_on:.3f}",
            f"{best:.3f}",
            f"{auto:.3f}",
            f"{auto / best:.2f}" if best > 0 else "-",
        )
        if r.detector == dets[-1]:
            table.add_section()
    console.print(table)
    means = summary(results)
    from sluice.health.monitor import MonitorConfig

    live_cfg = MonitorConfig()
    # The flow only: the live rule's bounds are in nats of the flow's window NLL, which the
    # baselines' scores are not (a 5-nat minimum spread would silence them).
    live = {n: apply_live(raw, live_cfg) for n, raw in raws[FLOW].items()}
    mt = Table(title="held-out means (every server counted once, with the setting its fold chose)")
    for h in ("detector", "F1 best", "F1 auto", "auto/best", "precision\n(auto)", "recall\n(auto)"):
        numeric = h != "detector"
        mt.add_column(h, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for d, m in means.items():
        mt.add_row(
            d,
            *(f"{m[x]:.3f}" for x in ("f1_best", "f1_auto")),
            f"{m['ratio']:.2f}",
            f"{m['precision']:.3f}",
            f"{m['recall']:.3f}",
        )
    rule = f"{live_cfg.threshold} q={live_cfg.q:g}" + (
        f" depth={live_cfg.dspot_depth}" if live_cfg.threshold == "dspot" else ""
    )
    outs = live.values()
    lb = float(np.nanmean([o.f1_best for o in outs]))
    la = float(np.nanmean([o.f1_auto for o in outs]))
    smoothing = f"smooth={live_cfg.detector.smooth} decay={live_cfg.detector.decay:g}"
    mt.add_row(
        f"{FLOW}, the live monitor's rule ({smoothing} bounded {rule}; chooses nothing)",
        f"{lb:.3f}",
        f"{la:.3f}",
        f"{la / max(lb, 1e-12):.2f}",
        f"{np.nanmean([o.precision for o in outs]):.3f}",
        f"{np.nanmean([o.recall for o in outs]):.3f}",
    )
    console.print(mt)
    fm = means[FLOW]
    console.print(
        f"{FLOW}: held-out automatic/best F1 {fm['ratio']:.2f} (goal >= 0.80: "
        + ("met" if fm["ratio"] >= 0.8 else "NOT met")
        + f"); grid: {len(settings[FLOW])} flow settings, criterion: highest mean automatic F1 on the choosing servers"
    )
    if json_out is not None:
        json_out.write_text(
            json.dumps(
                {
                    "protocol": "leave-servers-out",
                    "folds": k,
                    "results": [
                        {
                            "fold": r.fold,
                            "held_out": r.held_out,
                            "detector": r.detector,
                            "setting": asdict(r.setting),
                            "chosen_on": r.chosen_on,
                            "per_server": {n: asdict(o) for n, o in r.per_server.items()},
                        }
                        for r in results
                    ],
                    "mean": means,
                    "live_rule": {FLOW: {n: asdict(o) for n, o in live.items()}},
                },
                indent=1,
            )
        )
