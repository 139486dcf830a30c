"""What runs inside a training job: progress reports, checkpoints and a polite stop.

    from sluice import sdk

    state = sdk.checkpoint.load()                 # newest checkpoint or None: resume from it
    for step in range(start, total):
        loss = train_one_batch()
        sdk.report(step, loss=loss, total_steps=total)
        if sdk.checkpoint.due() or sdk.should_stop():
            sdk.checkpoint.save({"model": model.state_dict(), "step": step}, step)
            if sdk.should_stop():
                break                             # exit 0: sluice requeues or migrates the job

Imports nothing heavy (torch only inside `checkpoint.save/load`) and nothing of the control
plane, so it costs nothing to import and the same script runs without sluice around it.

Environment contract (set by the node agent for every attempt):

    SLUICE_JOB_ID                  the job's id                        (default "local")
    SLUICE_ATTEMPT                 attempt number, from 1              (default 1)
    SLUICE_RUN_DIR                 folder of this attempt; `report()`
                                   appends to <it>/progress.jsonl     (default ./sluice-run)
    SLUICE_CHECKPOINT_DIR          folder or fsspec URL of the job's
                                   checkpoints, shared by attempts    (default ./sluice-run/checkpoints)
    SLUICE_CHECKPOINT_INTERVAL_S   seconds between checkpoints that
                                   `checkpoint.due()` suggests        (default 30)
    SLUICE_CHECKPOINT_KEEP         newest checkpoints kept            (default 2)
    SLUICE_CPU_MAX, OMP_NUM_THREADS, MKL_NUM_THREADS
                                   the job's CPU ceiling rounded up; torch and BLAS size their
                                   thread pools from it, so a job limited to 2 cores does not
                                   run 16 threads fighting over them
                                   (at launch; see SLUICE_THREADS for a live cut)
    SLUICE_THREADS                 "auto" (default): `report()` keeps torch's intra-op pool at
                                   the CPU budget the process observes (its cgroup quota and
                                   affinity), so a live CPU cut is not a collapse; "manual":
                                   leave threads to the job (also `manage_threads(False)`).
                                   Other frameworks: `on_cpu_threads(fn)`; `cpu_budget()` shows it
    SLUICE_THREADS_CHECK_S         seconds between those checks        (default 5)
    SLUICE_TENANT, SLUICE_NODE     for the job's own logging
    CUDA_VISIBLE_DEVICES           the GPUs given to the job ("" when none), as CUDA numbers
                                   them inside the job's GPU fence: from 0 (docs/security.md)
    SLUICE_GPUS                    the same GPUs by the machine's numbers (nvidia-smi's)
    SLUICE_BATCH_MODE, SLUICE_REPLICAS_MIN, SLUICE_GLOBAL_BATCH
                                   the spec's `resources.replicas` batch semantics; with
                                   WORLD_SIZE and RANK (a gang's torchrun variables) they give
                                   `elastic()`: this replica's batch and learning-rate scale
                                   at the current world size (a policy may resize the job)

A leading "python"/"python3" in a job's command is replaced by the interpreter the control
plane runs under, so the job sees this same sluice package.

progress.jsonl lines: {"t": unix time, "step": int, "loss": float|null, "metrics": {...}}
and, per checkpoint, {"t": ..., "step": int, "checkpoint": path}. The metric `total_steps`
lets the control plane predict the remaining time.

Data-parallel jobs tell the plane what it needs to size them (docs/client.md lists the names):
`ThroughputMeter(...).metrics()` gives samples_per_s, steps_per_s, world_size and
global_batch; `GradientNoiseScale(ddp_model, ...).metrics()` gives grad_noise_scale,
grad_sqr, grad_var and gns_batch (the statistics Pollux's goodput model needs), measured
from the replicas' own gradients on their way to DDP's all-reduce.
"""

from __future__ import annotations

import sluice.sdk.checkpoint as checkpoint
from sluice.sdk._elastic import Elastic, elastic
from sluice.sdk._env import RunContext, context
from sluice.sdk._noise import GradientNoiseScale, NoiseScale, NoiseScaleEstimator
from sluice.sdk._progress import report
from sluice.sdk._stop import install_stop_handler, should_stop
from sluice.sdk._threads import CpuBudget, cpu_budget, manage_threads, on_cpu_threads
from sluice.sdk._throughput import ThroughputMeter

if context().under_sluice:
    # Under sluice a SIGTERM may come at any moment: catch it from the start. Run by hand
    # (or imported by a test runner) the handler waits for the first should_stop() call, so
    # merely importing the SDK never changes how the host process reacts to SIGTERM.
    install_stop_handler()

__all__ = [
    "CpuBudget",
    "Elastic",
    "GradientNoiseScale",
    "NoiseScale",
    "NoiseScaleEstimator",
    "RunContext",
    "ThroughputMeter",
    "checkpoint",
    "context",
    "cpu_budget",
    "elastic",
    "install_stop_handler",
    "manage_threads",
    "on_cpu_threads",
    "report",
    "should_stop",
]
