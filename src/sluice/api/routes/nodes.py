"""/v1/nodes: the cluster's nodes and taking them in and out of service."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sluice.api.auth import CallerDep, PlaneDep
from sluice.api.contract import Plane
from sluice.api.schemas import CordonIn, ErrorOut, jsonable

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut},
    403: {"model": ErrorOut, "description": "Only admins cordon nodes."},
    404: {"model": ErrorOut, "description": "No such node."},
}


def _node_out(plane: Plane, name: str) -> dict[str, Any]:
    """The node as `GET /v1/nodes` shows it, after the change."""
    for n in plane.nodes():
        out = jsonable(n)
        if isinstance(out, dict) and out.get("name") == name:
            return out
    return {"name": name}


@router.get("", responses=_ERRORS)
def list_nodes(plane: PlaneDep, caller: CallerDep) -> list[dict[str, Any]]:
    """Every node: capacity, health (and why), cached datasets."""
    return [n for n in (jsonable(x) for x in plane.nodes()) if isinstance(n, dict)]


@router.post("/{name}/cordon", responses=_ERRORS)
def cordon(plane: PlaneDep, caller: CallerDep, name: str, body: CordonIn) -> dict[str, Any]:
    """Stop placing jobs on the node and move its jobs off through their checkpoints."""
    plane.cordon(caller, name, body.reason)
    return _node_out(plane, name)


@router.post("/{name}/uncordon", responses=_ERRORS)
def uncordon(plane: PlaneDep, caller: CallerDep, name: str) -> dict[str, Any]:
    """Put the node back in service."""
    plane.uncordon(caller, name)
    return _node_out(plane, name)
