"""What the API needs of the control plane, as a structural type.

The API is typed against this protocol rather than the concrete `ControlPlane` so the HTTP
layer can be read (and checked) without the reconcile machinery behind it; the real
`sluice.control.plane.ControlPlane` satisfies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from sluice.model import JobRecord, Phase
from sluice.spec import JobSpec, TenantSpec


class Caller(Protocol):
    """An authenticated tenant."""

    name: str
    admin: bool


class EventLike(Protocol):
    seq: int
    time: float
    kind: str
    message: str
    job_id: str | None
    node: str | None
    data: dict[str, Any]


class Plane(Protocol):
    def authenticate(self, token: str) -> Any: ...
    def submit(self, caller: Any, spec: JobSpec) -> JobRecord: ...
    def list_jobs(self, caller: Any, phases: Iterable[Phase] | None = None) -> Sequence[JobRecord]: ...
    def get_job(self, caller: Any, job_id: str) -> JobRecord: ...
    def cancel(self, caller: Any, job_id: str) -> JobRecord: ...
    def why(self, caller: Any, job_id: str) -> Sequence[Any]: ...
    def log_path(self, caller: Any, job_id: str) -> Any: ...
    def progress(self, caller: Any, job_id: str) -> Any: ...
    def nodes(self) -> Sequence[Any]: ...
    def cordon(self, caller: Any, node: str, reason: str) -> Any: ...
    def uncordon(self, caller: Any, node: str) -> Any: ...
    def create_tenant(self, caller: Any, spec: TenantSpec) -> Any: ...
    def list_tenants(self, caller: Any) -> Sequence[Any]: ...
    def delete_tenant(self, caller: Any, name: str) -> Any: ...
