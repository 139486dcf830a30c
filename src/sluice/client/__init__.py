"""A typed Python client for the sluice API — what the `sluice` CLI itself uses.

    from sluice.client import Client
    with Client() as c:                      # $SLUICE_URL / $SLUICE_HOME, like the CLI
        job = c.submit("job.yaml")
        for line in c.follow_logs(job.id):
            print(line)
        print(c.wait(job.id).phase)

Errors are `SluiceError` subclasses (`NotFoundError`, `ForbiddenError`, `ConflictError`, `BadRequestError`, ...)
with the HTTP `status` and the server's words; a `BadRequestError` names each bad field.
"""

from sluice.client.api import Client
from sluice.client.config import server_url, token_for
from sluice.client.errors import (
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    ProtocolError,
    SluiceError,
    UnauthorizedError,
    UnavailableError,
    UnreachableError,
    WaitTimeout,
)
from sluice.client.models import (
    DatasetOut,
    DeletedOut,
    EventOut,
    FaultOut,
    FileEntryOut,
    JobFilesOut,
    JobOut,
    JobsDeletedOut,
    NewTenantOut,
    NodeOut,
    PriorityClassOut,
    Progress,
    QueueOut,
    TenantOut,
    UsageOut,
    WarmNode,
    WarmResult,
)

__all__ = [
    "BadRequestError",
    "Client",
    "ConflictError",
    "DatasetOut",
    "DeletedOut",
    "EventOut",
    "FaultOut",
    "FileEntryOut",
    "ForbiddenError",
    "JobFilesOut",
    "JobOut",
    "JobsDeletedOut",
    "NewTenantOut",
    "NodeOut",
    "NotFoundError",
    "PriorityClassOut",
    "Progress",
    "ProtocolError",
    "QueueOut",
    "SluiceError",
    "TenantOut",
    "UnauthorizedError",
    "UnavailableError",
    "UnreachableError",
    "UsageOut",
    "WaitTimeout",
    "WarmNode",
    "WarmResult",
    "server_url",
    "token_for",
]
