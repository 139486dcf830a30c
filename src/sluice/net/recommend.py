"""From measurements to a datapath per job profile: a pure function over numbers.

Profiles:
- `allreduce`: bandwidth-bound gradient exchange (data-parallel training of a sizeable
  model). Scored by the median all-reduce time of the largest message measured; without
  all-reduce numbers, by multi-stream TCP throughput.
- `latency`: many small messages (small models, parameter-server pings, pipeline
  hand-offs). Scored by the all-reduce time of the smallest message; without it, by the
  request/response p50.
- `data`: reading a dataset from a remote source (the cache's cold path). Scored by the
  geometric mean of the small-file and large-file read rates (MB/s), so neither the
  per-request cost nor the bandwidth alone decides.

Datapaths whose score is within the noise of the best (the larger of `tolerance` and the
best's own interquartile range over median, capped at MAX_NOISE) are a tie; a tie goes to the lower CPU cost per GB,
then to the simpler datapath (PREFERENCE). `host` is excluded unless allowed: host
networking gives tenants' jobs no network isolation from each other or from the node, and
sluice's tenants are mutually untrusted. The loopback reference is never a candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Profile = Literal["allreduce", "latency", "data"]
PROFILES: tuple[Profile, ...] = ("allreduce", "latency", "data")
PREFERENCE = ("routed", "bridge", "macvlan", "ipvlan", "vxlan", "ipip", "gre", "wireguard", "ipsec", "host")
"""Simplest first: no encapsulation before encapsulation, no L2 tricks before L2 tricks."""
MAX_NOISE = 0.25
"""A spread wider than this says the measurement is too noisy to rank by; it still ties at most 25 %."""


@dataclass(frozen=True)
class Measured:
    """One datapath's numbers (medians over repeats; *_spread = interquartile range / median)."""

    name: str
    cross_node: bool = True
    mtu: int | None = None
    tcp_1_gbps: float | None = None
    tcp_n_gbps: float | None = None
    tcp_n_spread: float = 0.0
    cpu_s_per_gb: float | None = None
    rr_p50_us: float | None = None
    rr_p99_us: float | None = None
    rr_spread: float = 0.0
    allreduce_s: dict[int, float] = field(default_factory=dict)
    """message bytes -> median seconds."""
    allreduce_spread: dict[int, float] = field(default_factory=dict)
    ddp_step_s: float | None = None
    data_small_mbps: float | None = None
    data_large_mbps: float | None = None
    data_spread: float = 0.0


@dataclass(frozen=True)
class Recommendation:
    profile: Profile
    datapath: str
    metric: str
    unit: str
    lower_is_better: bool
    scores: dict[str, float]
    tied: tuple[str, ...]
    reasons: tuple[str, ...]
    excluded: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "datapath": self.datapath,
            "metric": self.metric,
            "unit": self.unit,
            "lower_is_better": self.lower_is_better,
            "scores": self.scores,
            "tied": list(self.tied),
            "reasons": list(self.reasons),
            "excluded": self.excluded,
        }


class NoCandidate(ValueError):
    """Nothing measured can be recommended for this profile (the message says why)."""


def _score(m: Measured, profile: Profile) -> tuple[str, str, bool, float | None, float]:
    """(metric, unit, lower_is_better, value, relative spread) for one datapath."""
    if profile == "allreduce":
        if m.allreduce_s:
            size = max(m.allreduce_s)
            return (
                f"all-reduce time, {_human(size)}",
                "ms",
                True,
                m.allreduce_s[size] * 1e3,
                m.allreduce_spread.get(size, 0),
            )
        return "TCP throughput, several streams", "Gbit/s", False, m.tcp_n_gbps, m.tcp_n_spread
    if profile == "latency":
        if m.allreduce_s:
            size = min(m.allreduce_s)
            return (
                f"all-reduce time, {_human(size)}",
                "ms",
                True,
                m.allreduce_s[size] * 1e3,
                m.allreduce_spread.get(size, 0),
            )
        return "request/response p50", "µs", True, m.rr_p50_us, m.rr_spread
    if m.data_small_mbps is None or m.data_large_mbps is None:
        return "remote read rate", "MB/s", False, None, 0.0
    return "remote read rate (geo-mean small/large files)", "MB/s", False, math.sqrt(
        m.data_small_mbps * m.data_large_mbps
    ), m.data_spread  # fmt: skip


def _human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def recommend(
    measured: list[Measured], profile: Profile, *, allow_host: bool = False, tolerance: float = 0.05
) -> Recommendation:
    if profile not in PROFILES:
        raise ValueError(f"profile: {profile!r} is not one of {', '.join(PROFILES)}")
    excluded: dict[str, str] = {}
    scored: dict[str, tuple[float, float]] = {}
    metric, unit, lower = "", "", True
    by_name = {m.name: m for m in measured}
    for m in measured:
        metric_m, unit_m, lower_m, value, spread = _score(m, profile)
        if not m.cross_node:
            excluded[m.name] = "a same-machine reference, not a path between nodes"
        elif m.name == "host" and not allow_host:
            excluded[m.name] = "host networking isolates no tenant from another (allow with allow_host)"
        elif value is None or not math.isfinite(value) or value <= 0:
            excluded[m.name] = f"no {metric_m} measured"
        elif metric and metric_m != metric:
            excluded[m.name] = f"measured {metric_m}, the others {metric}: not comparable"
        else:
            metric, unit, lower = metric_m, unit_m, lower_m
            scored[m.name] = (value, spread)
    if not scored:
        raise NoCandidate(f"no datapath has the numbers the {profile} profile needs: {excluded}")

    best_name = min(scored, key=lambda n: scored[n][0]) if lower else max(scored, key=lambda n: scored[n][0])
    best, best_spread = scored[best_name]
    noise = max(tolerance, min(best_spread, MAX_NOISE))

    def gap(v: float) -> float:  # how much worse than the best, as a fraction of the best
        return (v - best) / best if lower else (best - v) / best

    tied = [n for n, (v, _) in scored.items() if gap(v) <= noise]

    def tie_key(n: str) -> tuple[float, int]:
        cpu = by_name[n].cpu_s_per_gb
        rank = PREFERENCE.index(n) if n in PREFERENCE else len(PREFERENCE)
        return (cpu if cpu is not None and math.isfinite(cpu) else math.inf, rank)

    choice = min(tied, key=tie_key)
    tied.sort(key=tie_key)
    reasons = [f"{profile}: scored by {metric} ({'lower' if lower else 'higher'} is better)"]
    for n, (v, s) in sorted(scored.items(), key=lambda kv: kv[1][0], reverse=not lower):
        mark = " <- best" if n == best_name else ("" if gap(v) > noise else " (within noise of the best)")
        reasons.append(f"  {n}: {v:.4g} {unit} (spread {s:.0%}, {gap(v):+.0%} vs best){mark}")
    if len(tied) > 1:
        cpu = by_name[choice].cpu_s_per_gb
        why = f"lowest CPU per GB ({cpu:.3g} CPU-s/GB)" if cpu is not None and math.isfinite(cpu) else "simplest"
        reasons.append(f"{', '.join(tied)} are within {noise:.0%} of each other; {choice} chosen: {why}")
    mc = by_name[choice]
    if mc.mtu is not None:
        reasons.append(f"{choice}: MTU {mc.mtu}")
    if mc.ddp_step_s is not None and profile == "allreduce":
        reasons.append(f"{choice}: data-parallel example step {mc.ddp_step_s * 1e3:.3g} ms")
    if mc.rr_p50_us is not None and profile == "latency":
        reasons.append(f"{choice}: request/response p50 {mc.rr_p50_us:.3g} µs, p99 {mc.rr_p99_us or 0:.3g} µs")
    return Recommendation(
        profile=profile,
        datapath=choice,
        metric=metric,
        unit=unit,
        lower_is_better=lower,
        scores={n: v for n, (v, _) in scored.items()},
        tied=tuple(tied),
        reasons=tuple(reasons),
        excluded=excluded,
    )


# ---------------------------------------------------------------------- from bench JSON
def _med(d: Any, *keys: str) -> float | None:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return float(d) if isinstance(d, int | float) else None


def _spread(stats: Any) -> float:
    """Interquartile range over median: robust to the one slow round a busy machine gives."""
    if not isinstance(stats, dict) or not stats.get("median"):
        return 0.0
    if "p25" in stats and "p75" in stats:
        return float((stats["p75"] - stats["p25"]) / stats["median"])
    return float((stats["max"] - stats["min"]) / stats["median"])


def from_results(results: dict[str, Any]) -> list[Measured]:
    """The Measured values of a `sluice net bench` JSON (skipped/failed parts stay None)."""
    out = []
    for name, d in results.get("datapaths", {}).items():
        if not isinstance(d, dict) or "skipped" in d or ("error" in d and len(d) == 1):
            continue
        ar = d.get("allreduce") or {}
        ar_s: dict[int, float] = {}
        ar_spread: dict[int, float] = {}
        if ar.get("exact"):
            for row in ar.get("sizes", []):
                med = _med(row, "time_s", "median")
                if med is not None:
                    ar_s[int(row["bytes"])] = med
                    ar_spread[int(row["bytes"])] = _spread(row["time_s"])
        data = d.get("data") or {}
        out.append(
            Measured(
                name=name,
                cross_node=bool(d.get("cross_node", True)),
                mtu=d.get("mtu"),
                tcp_1_gbps=_med(d.get("tcp_1"), "gbps", "median"),
                tcp_n_gbps=_med(d.get("tcp_n"), "gbps", "median"),
                tcp_n_spread=_spread((d.get("tcp_n") or {}).get("gbps")),
                cpu_s_per_gb=_med(d.get("tcp_n"), "cpu_s_per_gb", "median")
                or _med(d.get("tcp_1"), "cpu_s_per_gb", "median"),
                rr_p50_us=_med(d.get("latency"), "p50_us", "median"),
                rr_p99_us=_med(d.get("latency"), "p99_us", "median"),
                rr_spread=_spread((d.get("latency") or {}).get("p50_us")),
                allreduce_s=ar_s,
                allreduce_spread=ar_spread,
                ddp_step_s=_med(d.get("ddp"), "step_s", "median"),
                data_small_mbps=_med(data, "small", "mb_per_s", "median"),
                data_large_mbps=_med(data, "large", "mb_per_s", "median"),
                data_spread=max(_spread((data.get("small") or {}).get("mb_per_s")),
                                _spread((data.get("large") or {}).get("mb_per_s"))),
            )
        )  # fmt: skip
    return out
