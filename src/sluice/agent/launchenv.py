"""What a job process is started with: its resolved argv, working directory and environment.

The job does NOT inherit the control plane's environment: only a short allow-list of
harmless variables (PATH, HOME, locale, ...) passes, then the spec's env, then the SLUICE_*
contract of `sluice.sdk`. So a token or database URL in the control plane never reaches
tenant code (FfDL's learner isolation).

A leading "python"/"python3" is replaced by the interpreter the agent runs under (or the
one settings.job_python names), so a spec written as ["python", "train.py"] gets the same
Python (and the same installed sluice SDK) as the control plane, not whatever `python`
happens to be first on PATH.

Under tenant isolation the job's HOME is its own work folder, and USER/LOGNAME name its uid
(`sluice-<uid>`), not the plane's user: the job is not that user. They must name something:
the uid has no passwd entry, so `getpass.getuser()` without them raises — and PyTorch calls it
when DDP imports its compiler (seen on an H100 machine: every DDP job of a tenant failed
`KeyError: 'getpwuid(): uid not found'`).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from sluice.model import LaunchRequest

PASS_THROUGH = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
)
PASS_PREFIXES = ("SLUICE_CACHE_",)
"""The node cache's knobs: every job of a node must find the same cache."""
PYTHON_ALIASES = frozenset({"python", "python3"})


class LaunchError(ValueError):
    """A request that can never work (missing workdir, program not found)."""


def resolve_workdir(req: LaunchRequest, default: Path) -> Path:
    if req.spec.workdir is None:
        default.mkdir(parents=True, exist_ok=True)
        return default
    wd = Path(req.spec.workdir)
    if not wd.is_dir():
        raise LaunchError(f"workdir {str(wd)!r} does not exist or is not a directory")
    return wd


def resolve_argv(argv: list[str], cwd: Path, path_var: str | None, python: str | None = None) -> list[str]:
    prog = argv[0]
    if prog in PYTHON_ALIASES:
        return [python or sys.executable, *argv[1:]]
    if "/" in prog:
        full = (cwd / prog) if not os.path.isabs(prog) else Path(prog)
        if not full.is_file():
            raise LaunchError(f"command[0]: program {prog!r} not found (looked at {full})")
        if not os.access(full, os.X_OK):
            raise LaunchError(f"command[0]: program {prog!r} is not executable")
        return [str(full), *argv[1:]]
    found = shutil.which(prog, path=path_var)
    if found is None:
        raise LaunchError(f"command[0]: program {prog!r} not found on PATH")
    return [found, *argv[1:]]


def job_cpu_max(req: LaunchRequest, node_cpus: float) -> int:
    """Threads the job should use: its CPU ceiling rounded up (spec max, else the node)."""
    a = req.allocation.assignments[0]
    cap = req.spec.resources.cpu.max or a.cpu_limit or node_cpus
    return max(1, math.ceil(min(cap, node_cpus) - 1e-9))


def net_env(interface: str | None) -> dict[str, str]:
    """Pin a job's collective traffic to the node's chosen interface (setting `net_interface`,
    from `sluice net recommend --apply`): gloo and NCCL otherwise bind to whatever interface
    the host name resolves to, which on a multi-homed node may be the slow or encrypted one."""
    if not interface:
        return {}
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


def build_env(
    req: LaunchRequest,
    *,
    run_dir: Path,
    node: str,
    node_cpus: float,
    gpus: list[str],
    base: Mapping[str, str] | None = None,
    home: Path | None = None,
    job_home: Path | None = None,
    net_interface: str | None = None,
    visible: Sequence[str] | None = None,
    tmp_dir: Path | None = None,
) -> dict[str, str]:
    """`job_home`: the job's HOME when it runs as a tenant uid of its own (isolation);
    `tmp_dir`: its TMPDIR (a spec's own `env` may still name another);
    `visible`: the job's CUDA_VISIBLE_DEVICES where it differs from the node's ids `gpus`
    (inside a GPU fence CUDA numbers the job's GPUs from 0: agent/gpu_fence.py)."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in PASS_THROUGH or k.startswith(PASS_PREFIXES)}
    if job_home is not None:
        env["HOME"] = str(job_home)
        name = f"sluice-{req.run_as.uid}" if req.run_as is not None else "sluice-job"
        env["USER"] = env["LOGNAME"] = name
    if home is not None:
        env["SLUICE_HOME"] = str(home)  # the node's dataset cache lives under it
    if tmp_dir is not None:
        env["TMPDIR"] = str(tmp_dir)
    threads = str(job_cpu_max(req, node_cpus))
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    env.update(net_env(net_interface))  # before the spec's env: a job may name its own interface
    env.update(req.spec.env)
    env.update(req.env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus if visible is None else visible)
    # The ids are nvidia-smi's and NVML's (PCI bus order), as the node reads its GPUs' KPIs;
    # CUDA's own default order is fastest first, another GPU on a machine of mixed models.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.update(
        {
            "SLUICE_JOB_ID": req.job_id,
            "SLUICE_ATTEMPT": str(req.attempt),
            "SLUICE_TENANT": req.tenant,
            "SLUICE_NODE": node,
            "SLUICE_RUN_DIR": str(run_dir),
            "SLUICE_CHECKPOINT_DIR": req.checkpoint_dir,
            "SLUICE_CHECKPOINT_INTERVAL_S": repr(float(req.spec.checkpoint.interval_s)),
            "SLUICE_CHECKPOINT_KEEP": str(req.spec.checkpoint.keep),
            "SLUICE_CPU_MAX": threads,
            "SLUICE_GPUS": ",".join(gpus),
            **elastic_env(req),
            **array_env(req),
        }
    )
    return env


def array_env(req: LaunchRequest) -> dict[str, str]:
    """A job of an array (`array` in its spec) is told which one it is: Slurm's
    SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT under sluice's names."""
    a = req.spec.array
    if a is None or a.id is None or a.index is None:
        return {}
    return {"SLUICE_ARRAY_ID": a.id, "SLUICE_ARRAY_INDEX": str(a.index), "SLUICE_ARRAY_COUNT": str(a.count)}


def elastic_env(req: LaunchRequest) -> dict[str, str]:
    """The spec's batch semantics for `sluice.sdk.elastic()`, which combines them with
    WORLD_SIZE and RANK: every attempt of a resized job gets the same values, so each
    computes its own per-replica batch and learning-rate scale at its new world size."""
    rng = req.spec.resources.replicas
    env = {"SLUICE_BATCH_MODE": rng.batch, "SLUICE_REPLICAS_MIN": str(rng.min)}
    if rng.global_batch is not None:
        env["SLUICE_GLOBAL_BATCH"] = str(rng.global_batch)
    return env


def sized_as_a_gang(req: LaunchRequest) -> bool:
    """Whether the job gets torchrun's variables (gang_env) at every size, one included
    (WORLD_SIZE=1), as torchrun gives them to one worker: an elastic job (`replicas.max` above
    1) runs the same script at whatever size a policy gives it, so a policy that shrinks it to
    one replica must not take away the RANK/WORLD_SIZE/MASTER_* its `init_process_group`
    (env://) reads. A job of one replica only gets none of them."""
    rng = req.spec.resources.replicas
    return (rng.max or rng.min) > 1


def gang_env(rank: int, nodes: Sequence[str], master_addr: str, master_port: int) -> dict[str, str]:
    """torchrun's variables for replica `rank` of a gang whose replica k runs on `nodes[k]`.

    So a script written for `torchrun` (`init_process_group("gloo")`, env://) runs unchanged:
    each distinct node is one of torchrun's groups (GROUP_RANK, in order of first use);
    LOCAL_RANK counts the replicas before this one on the same node. Ranks follow the
    allocation's order, as the Ray engine's do. Each replica sees only its own GPUs
    (CUDA_VISIBLE_DEVICES), so it uses `cuda:0`, not `cuda:LOCAL_RANK`."""
    groups = list(dict.fromkeys(nodes))
    node = nodes[rank]
    local = [k for k, n in enumerate(nodes) if n == node]
    world = str(len(nodes))
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": world,
        "RANK": str(rank),
        "LOCAL_RANK": str(local.index(rank)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "GROUP_RANK": str(groups.index(node)),
        "GROUP_WORLD_SIZE": str(len(groups)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": world,
        "SLUICE_REPLICA": str(rank),
    }
