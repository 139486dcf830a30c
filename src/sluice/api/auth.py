"""Bearer-token authentication: the token names the tenant; the control plane decides."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from sluice.control.errors import Forbidden, Unauthorized
from sluice.control.plane import ControlPlane

bearer = HTTPBearer(auto_error=False, description="A tenant's API token (see `sluice tenant create`).")


def plane_of(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.plane
    return plane


def caller(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Any:
    """The authenticated tenant; 401 for a missing, malformed or unknown token."""
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>'")
    return plane_of(request).authenticate(creds.credentials)


PlaneDep = Annotated[ControlPlane, Depends(plane_of)]
CallerDep = Annotated[Any, Depends(caller)]


def admin_caller(who: Annotated[Any, Depends(caller)]) -> Any:
    """The authenticated tenant, which must be an admin: 403 otherwise — before the request
    body is read, so a tenant learns nothing from how its body would have been judged."""
    if not who.admin:
        raise Forbidden("this needs an admin token")
    return who


AdminDep = Annotated[Any, Depends(admin_caller)]
