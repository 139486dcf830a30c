"""/v1/nodes: the cluster's nodes and taking them in and out of service."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request

from sluice.api.auth import AdminDep, CallerDep, PlaneDep
from sluice.api.pagination import DEFAULT_LIMIT, CursorQ, LimitQ, Page, decode_cursor, page_of
from sluice.api.schemas import AlarmWhyOut, CordonIn, ErrorOut, FaultIn, NodeWhyOut, jsonable
from sluice.control.errors import NotFound
from sluice.control.plane import ControlPlane
from sluice.health.monitor import HealthMonitor
from sluice.spec import SpecError
from sluice.spec.errors import FieldProblem

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "Only admins cordon nodes."},
    404: {"model": ErrorOut, "description": "No such node."},
}


def _node_out(plane: ControlPlane, name: str) -> dict[str, Any]:
    """The node as `GET /v1/nodes` shows it, after the change."""
    for n in plane.nodes():
        out = jsonable(n)
        if isinstance(out, dict) and out.get("name") == name:
            return out
    return {"name": name}


@router.get("", response_model=Page[dict[str, Any]], responses=_ERRORS)
def list_nodes(
    plane: PlaneDep, caller: CallerDep, limit: LimitQ = DEFAULT_LIMIT, cursor: CursorQ = None
) -> Page[dict[str, Any]]:
    """Every node (capacity, health and why, cached datasets), by name, a page at a time."""
    after = decode_cursor("nodes", cursor, (str,))
    nodes = sorted((n for n in (jsonable(x) for x in plane.nodes()) if isinstance(n, dict)), key=lambda n: n["name"])
    rest = [n for n in nodes if after is None or n["name"] > after[0]]
    page, nxt = page_of(rest[: limit + 1], limit, "nodes", lambda n: (n["name"],))
    return Page[dict[str, Any]](items=page, next_cursor=nxt)


def _monitor_status(plane: ControlPlane, name: str) -> dict[str, Any] | None:
    """The health monitor's view of the node (None where it does not run or has not seen the
    node): score against threshold, health, alarms. NaN (no model yet) becomes null. The
    free-text reason is left out: the node's own JSON carries it already."""
    if not isinstance(plane.health, HealthMonitor):
        return None
    st = plane.health.status().get(name)
    if st is None:
        return None
    out: dict[str, Any] = {}
    for key in ("health", "model", "score", "threshold", "alarms", "samples"):
        v = st.get(key)
        out[key] = None if isinstance(v, float) and not math.isfinite(v) else v
    return out


@router.get("/{name}/kpis", responses=_ERRORS)
def node_kpis(request: Request, plane: PlaneDep, caller: CallerDep, name: str) -> dict[str, Any]:
    """The node's recent KPI samples (CPU busy %, memory used %, and the peer-excess kernel
    and iowait shares where present), oldest first, at most the last 300; and the health
    monitor's score against its threshold where it runs. Machine facts only: visible to every
    tenant, as the node list is, and naming no job."""
    if name not in {n.name for n in plane.nodes()}:
        raise NotFound(f"node {name!r} not found")
    return {
        "node": name,
        "samples": request.app.state.metrics.kpi_history(name),
        "monitor": _monitor_status(plane, name),
    }


@router.get("/{name}/why", response_model=NodeWhyOut, responses=_ERRORS)
def node_why(plane: PlaneDep, caller: CallerDep, name: str) -> NodeWhyOut:
    """Why the node is in its health state: its reason, and the health monitor's newest counted
    alarm with each KPI that drove it (share, value then, healthy mean and spread). Machine
    facts only, as `/kpis`: visible to every tenant, naming no job."""
    node = next((n for n in plane.nodes() if n.name == name), None)
    if node is None:
        raise NotFound(f"node {name!r} not found")
    out = NodeWhyOut(node=name, health=str(node.health), reason=node.reason, monitored=False)
    if not isinstance(plane.health, HealthMonitor):
        return out
    st = plane.health.status().get(name)
    if st is None:
        return out

    def finite(v: object) -> float | None:
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else None

    why = st.get("why")
    alarm = AlarmWhyOut.model_validate(why) if isinstance(why, dict) and why else None
    alarms, held = st.get("alarms"), st.get("held")

    def count(v: object) -> int | None:
        return v if isinstance(v, int) else None

    state = st.get("state")
    return out.model_copy(
        update={
            "monitored": True,
            "state": state if state in ("learning", "refitting", "scoring") else None,
            "healthy_samples": count(st.get("healthy_samples")),
            "train_samples": count(st.get("train_samples")),
            "score": finite(st.get("score")),
            "scored_at": finite(st.get("scored_at")),
            "threshold": finite(st.get("threshold")),
            "alarms": alarms if isinstance(alarms, int) else 0,
            "held": held if isinstance(held, int) else 0,
            "alarm": alarm,
        }
    )


@router.post("/{name}/cordon", responses=_ERRORS)
def cordon(plane: PlaneDep, caller: AdminDep, name: str, body: CordonIn) -> dict[str, Any]:
    """Stop placing jobs on the node and move its jobs off through their checkpoints. The
    node as `GET /v1/nodes` shows it, plus `moved_jobs` (the ids of the jobs this moves off
    it) and `other_schedulable_nodes` (0: the moved jobs wait until a node can take them)."""
    outcome = plane.cordon(caller, name, body.reason)
    return {**_node_out(plane, name), "moved_jobs": outcome.moved, "other_schedulable_nodes": outcome.other_schedulable}


@router.post("/{name}/uncordon", responses=_ERRORS)
def uncordon(plane: PlaneDep, caller: CallerDep, name: str) -> dict[str, Any]:
    """Put the node back in service."""
    plane.uncordon(caller, name)
    return _node_out(plane, name)


_FAULT_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "Only admins inject faults."},
    404: {"model": ErrorOut, "description": "No such node, or no live agent on it."},
    409: {"model": ErrorOut, "description": "This engine cannot inject faults."},
}


@router.post("/{name}/faults", responses=_FAULT_ERRORS, status_code=201)
def inject_fault(plane: PlaneDep, caller: AdminDep, name: str, body: FaultIn) -> dict[str, Any]:
    """Make the node sick on purpose for a while (CPU hog, memory pressure or I/O storm pinned
    to its cores): to check that the health loop cordons it and moves its jobs."""
    # A field the kind does not use is refused, not ignored (`--workers` on a memory fault ran
    # one worker; `--memory-mb` on a cpu fault held nothing) (walk5).
    if body.kind == "memory" and body.workers is not None:
        raise SpecError([FieldProblem("workers", "a memory fault runs one worker; give memory_mb instead")])
    if body.kind != "memory" and body.memory_mb is not None:
        raise SpecError(
            [FieldProblem("memory_mb", f"a {body.kind} fault holds no memory; only a memory fault takes memory_mb")]
        )
    memory_mb = 512 if body.memory_mb is None else body.memory_mb
    report = plane.inject_fault(caller, name, body.kind, body.seconds, body.workers, memory_mb)
    out = jsonable(report)
    return out if isinstance(out, dict) else {"node": name}


@router.delete("/{name}/faults", responses=_FAULT_ERRORS)
def stop_faults(plane: PlaneDep, caller: CallerDep, name: str) -> dict[str, Any]:
    """Stop every fault injected on the node now."""
    return {"node": name, "stopped": plane.stop_faults(caller, name)}
