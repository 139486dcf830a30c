"""Turning per-KPI attribution shares into the short reason an operator reads."""

from __future__ import annotations

from collections.abc import Mapping


def top_kpis(shares: Mapping[str, float], n: int = 3) -> list[tuple[str, float]]:
    """The n KPIs with the largest share, largest first (ties by name, for stable reasons)."""
    return sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def describe(score: float, threshold: float, shares: Mapping[str, float], n: int = 3) -> str:
    """E.g. 'score 41.2 > threshold 18.0; top KPIs: cpu_total 46%, load1 21%, cpu_core1 9%'."""
    tops = ", ".join(f"{k} {100 * v:.0f}%" for k, v in top_kpis(shares, n))
    return f"score {score:.1f} > threshold {threshold:.1f}; top KPIs: {tops}"
