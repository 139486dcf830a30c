"""A typed Python client for the sluice API — what the `sluice` CLI itself uses.

    from sluice.client import Client
    with Client() as c:                      # $SLUICE_URL / $SLUICE_HOME, like the CLI
        job = c.submit("job.yaml")
        for line in c.follow_logs(job.id):
            print(line)
        print(c.wait(job.id).phase)

Errors are `SluiceError` subclasses (`NotFound`, `Forbidden`, `Conflict`, `BadRequest`, ...)
with the HTTP `status` and the server's words; a `BadRequest` names each bad field.
"""

from sluice.client.api import Client
from sluice.client.config import server_url, token_for
from sluice.client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    ProtocolError,
    SluiceError,
    Unauthorized,
    Unavailable,
    Unreachable,
    WaitTimeout,
)
from sluice.client.models import (
    DatasetOut,
    DeletedOut,
    EventOut,
    FaultOut,
    JobOut,
    NewTenantOut,
    NodeOut,
    Progress,
    QueueOut,
    TenantOut,
    WarmNode,
    WarmOut,
)

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "DatasetOut",
    "DeletedOut",
    "EventOut",
    "FaultOut",
    "Forbidden",
    "JobOut",
    "NewTenantOut",
    "NodeOut",
    "NotFound",
    "Progress",
    "ProtocolError",
    "QueueOut",
    "SluiceError",
    "TenantOut",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "WaitTimeout",
    "WarmNode",
    "WarmOut",
    "server_url",
    "token_for",
]
