"""What an engine can carry out and observe, declared as types instead of guessed at.

The controller reads an engine's `capabilities` before it records a decision: a decision
the engine cannot carry out (a GPU resize on an engine that cannot change a running job's
GPUs, a gang of replicas on an engine that runs one process per job) is refused with its
reason instead of being written down as done. Policies see the same declaration in the
ClusterView, so they need not propose what cannot happen.

It lives in `model` because every engine, including the simulator (which may import only
`model`), declares one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineCapabilities:
    """Each flag: can the engine do (or see) this? All default to False: declare, don't assume.

    live_cpu_resize:     change a running job's CPU limit in place, same processes (Resize).
    gpu_resize:          change a running job's GPU count in place (no real engine can).
    gang_launch:         start a job's replicas all together or not at all (replicas > 1).
    migration:           stop a job with a checkpoint and resume it on another node (Migrate).
    node_kpis:           report NodeKPIs samples (what the health monitor models).
    job_progress:        report JobProgress from the job's own `sdk.report` lines.
    measured_throughput: report usage and progress that let a policy measure a job's
                         throughput at the allocations it actually had.
    max_replicas:        most replicas one job may have on this engine (1 without gangs).
    memory_limits:       enforce `resources.memory_mb` with the kernel's memory controller
                         (a job over it is OOM-killed and reported OOMKilled); without it a
                         job that sets memory_mb is refused at submit, never run unlimited.
    """

    live_cpu_resize: bool = False
    gpu_resize: bool = False
    gang_launch: bool = False
    migration: bool = False
    node_kpis: bool = False
    job_progress: bool = False
    measured_throughput: bool = False
    max_replicas: int = 1
    memory_limits: bool = False
