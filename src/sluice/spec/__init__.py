"""The public contract: job, dataset and tenant specs, and loading them with clear errors.

This package imports nothing else of sluice; every other part may import it.
"""

from sluice.spec.dataset import DatasetSpec
from sluice.spec.errors import SpecError
from sluice.spec.job import (
    ArraySpec,
    CheckpointSpec,
    DatasetMount,
    JobSpec,
    QoETarget,
    Resources,
)
from sluice.spec.loading import load_job_spec, load_spec_file, parse_job_spec
from sluice.spec.queue import (
    GrantSpec,
    PreemptionSpec,
    PriorityClassSpec,
    QueuePatch,
    QueueSpec,
    QuotaSpec,
    TenantPatch,
)
from sluice.spec.tenant import TenantSpec

__all__ = [
    "ArraySpec",
    "CheckpointSpec",
    "DatasetMount",
    "DatasetSpec",
    "GrantSpec",
    "JobSpec",
    "PreemptionSpec",
    "PriorityClassSpec",
    "QoETarget",
    "QueuePatch",
    "QueueSpec",
    "QuotaSpec",
    "Resources",
    "SpecError",
    "TenantPatch",
    "TenantSpec",
    "load_job_spec",
    "load_spec_file",
    "parse_job_spec",
]
