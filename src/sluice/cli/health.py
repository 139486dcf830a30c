"""`sluice health ...`: Node health: anomaly detection models and their offline evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
    q: Annotated[float, typer.Option(min=1e-9, max=0.5, help="SPOT risk: healthy exceedance probability.")] = 1e-3,
    smooth: Annotated[int, typer.Option(min=1, help="Flow score: weighted mean of this many newest windows.")] = 5,
    decay: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Flow score: weight of the newest window (0 = equal weights).")
    ] = 0.7,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write every row to this JSON file.")] = None,
) -> None:
    """Score the flow detector and baselines on every entity; print per entity and averaged.

    Point-adjusted F1 (PA) is inflated — a segment counts as found if one point is flagged —
    so read it beside the point-wise F1, PA%K and AUPRC.
    """
    from sluice.health.detector import DetectorConfig
    from sluice.health.evaluation import METRICS, DatasetError, average, contenders, evaluate_entity, load_folder

    console = Console()
    only = [e.strip() for e in entities.split(",") if e.strip()] if entities else None
    makers = contenders(
        DetectorConfig(epochs=epochs, max_train_s=max_train_s, smooth=smooth, decay=decay), baselines=baselines
    )
    rows = []
    try:
        ents = list(load_folder(folder, only))
    except DatasetError as err:
        console.print(f"[red]error:[/red] folder: {err}")
        raise typer.Exit(2) from None
    table = Table(title=f"sluice health eval {folder}")
    table.add_column("entity")
    table.add_column("detector")
    for h in _HEAD:
        table.add_column(h, justify="right")
    with console.status("evaluating") as status:
        for ent in ents:
            for name, make in makers.items():
                status.update(f"{ent.name}: {name}")
                row = evaluate_entity(ent, name, make, q=q)
                rows.append(row)
                d = row.as_dict()
                table.add_row(ent.name, name, *(_fmt(float(d[m]), m) for m in METRICS))  # type: ignore[arg-type]
            table.add_section()
    means = average(rows)
    for det, avg in means.items():
        table.add_row("[b]mean[/b]", f"[b]{det}[/b]", *(_fmt(avg[m], m) for m in METRICS))
    console.print(table)
    console.print("note: point-adjusted F1 (F1 PA) is inflated; compare detectors on F1 best and AUPRC.")
    for det, avg in means.items():
        best = max(avg["f1_best"], 1e-12)
        console.print(
            f"{det}: automatic threshold F1 / best-threshold F1: SPOT {avg['f1_spot'] / best:.2f}, "
            f"drift-aware SPOT {avg['f1_dspot'] / best:.2f} (goal >= 0.80)"
        )
    if json_out is not None:
        json_out.write_text(json.dumps({"rows": [r.as_dict() for r in rows], "mean": average(rows)}, indent=1))
