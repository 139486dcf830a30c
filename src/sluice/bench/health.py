"""`sluice bench health`: the flow detector against PCA, Isolation Forest and an autoencoder
on a labelled folder (default: shared/data/anomaly/asd), averaged over its entities, with
the flow/best-baseline ratio of every quality metric and the issue's goals checked."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.health.detector import DetectorConfig
from sluice.health.evaluation import average, contenders, evaluate_entity, load_folder

DEFAULT_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "anomaly" / "asd"
QUALITY = ("f1_best", "f1_spot", "f1_pa", "f1_pak", "auroc", "auprc")


def run(folder: Path, entities: list[str] | None = None, out: Path | None = None) -> dict[str, dict[str, float]]:
    console = Console()
    rows = []
    makers = contenders(DetectorConfig())
    ents = list(load_folder(folder, entities))
    with console.status("scoring") as status:
        for ent in ents:
            for name, make in makers.items():
                status.update(f"{ent.name}: {name}")
                rows.append(evaluate_entity(ent, name, make))
    avg = average(rows)
    table = Table(title=f"mean over {len(ents)} entities of {folder}")
    table.add_column("detector")
    for m in (*QUALITY, "train_s", "windows_per_s"):
        table.add_column(m, justify="right")
    for det, a in avg.items():
        table.add_row(det, *(f"{a[m]:.3f}" for m in QUALITY), f"{a['train_s']:.1f}", f"{a['windows_per_s']:,.0f}")
    flow = avg["sluice-flow"]
    base = {k: v for k, v in avg.items() if k != "sluice-flow"}
    table.add_section()
    table.add_row(
        "flow / best baseline", *(f"{flow[m] / max(max(b[m] for b in base.values()), 1e-12):.2f}x" for m in QUALITY)
    )
    console.print(table)
    console.print("note: point-adjusted F1 (f1_pa) is inflated; compare on f1_best and auprc.")
    best_train = max(r.train_s for r in rows if r.detector == "sluice-flow")
    goals = {
        "beats every baseline on f1_best": all(flow["f1_best"] > b["f1_best"] for b in base.values()),
        "beats every baseline on auprc": all(flow["auprc"] > b["auprc"] for b in base.values()),
        "point-adjusted F1 >= 0.90": flow["f1_pa"] >= 0.90,
        "training <= 120 s per entity (slowest)": best_train <= 120.0,
        "scoring >= 10,000 windows/s": flow["windows_per_s"] >= 10_000,
    }
    for goal, ok in goals.items():
        console.print(f"{'met' if ok else 'NOT met'}: {goal}")
    if out is not None:
        out.write_text(json.dumps({"rows": [r.as_dict() for r in rows], "mean": avg, "goals": goals}, indent=1))
    return avg
