"""The bench results as a table: one row per datapath, medians with their spread."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "DATAPATH", "MTU", "TCP 1 (Gb/s)", "TCP N (Gb/s)", "CPU-s/GB", "RR p50 (µs)", "RR p99 (µs)",
    "AR small (ms)", "AR large (ms)", "DDP step (ms)", "DATA small (MB/s)", "DATA large (MB/s)",
)  # fmt: skip


def _fmt(stats: Any, scale: float = 1.0) -> str:
    """median ±half-range; the problem in words when the measurement did not run."""
    if not isinstance(stats, dict):
        return "-"
    if "median" not in stats:
        return "-"
    med = stats["median"] * scale
    half = (stats["max"] - stats["min"]) * scale / 2
    return f"{med:.3g} ±{half:.2g}" if stats.get("n", 1) > 1 else f"{med:.3g}"


def _why(part: Any) -> str | None:
    if isinstance(part, dict):
        if "skipped" in part:
            return "skipped"
        if "error" in part:
            return "error"
    return None


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, d in results.get("datapaths", {}).items():
        if "skipped" in d or ("error" in d and "mtu" not in d):
            out.append([name, "-", *(["-"] * (len(COLUMNS) - 3)), d.get("skipped") or d.get("error", "")])
            continue

        def cell(key: str, *path: str, scale: float = 1.0, d: dict[str, Any] = d) -> str:
            part = d.get(key)
            why = _why(part)
            if why or part is None:
                return why or "-"
            for p in path:
                part = part.get(p) if isinstance(part, dict) else None
            return _fmt(part, scale)

        def ddp_cell(d: dict[str, Any] = d) -> str:
            """The step time; `!` when a rank failed only after its last step (JSON: teardown_failed)."""
            shown = cell("ddp", "step_s", scale=1e3)
            return shown + " !" if isinstance(d.get("ddp"), dict) and d["ddp"].get("teardown_failed") else shown

        ar = d.get("allreduce") or {}
        sizes = ar.get("sizes") or []
        ar_small = _fmt(sizes[0]["time_s"], 1e3) if sizes else (_why(ar) or "-")
        ar_large = _fmt(sizes[-1]["time_s"], 1e3) if sizes else (_why(ar) or "-")
        if sizes and not ar.get("exact", False):
            ar_small = ar_large = "WRONG SUM"
        out.append([
            name, str(d.get("mtu", "-")), cell("tcp_1", "gbps"), cell("tcp_n", "gbps"), cell("tcp_n", "cpu_s_per_gb"),
            cell("latency", "p50_us"), cell("latency", "p99_us"), ar_small, ar_large,
            ddp_cell(d), cell("data", "small", "mb_per_s"), cell("data", "large", "mb_per_s"),
        ])  # fmt: skip
    return out


def markdown(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r[: len(COLUMNS)]) + " |" for r in rows(results)]
    return "\n".join(lines)
