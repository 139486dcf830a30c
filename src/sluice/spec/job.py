"""JobSpec: what a tenant asks sluice to run.

Every field is optional except `command`. Unknown fields are rejected rather than ignored,
because a misspelt `max_restarts` silently ignored is a job that is not retried.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, ClassVar, Literal

from pydantic import AwareDatetime, Field, ValidationInfo, field_validator, model_validator

from sluice.spec.base import MAX_RUNTIME_S, Name, SpecModel, shown

MAX_ARGV_ITEMS = 256
MAX_ARG_LENGTH = 8192

_SHELL_META = re.compile(r"[;&|`$<>]|\$\(|&&|\|\|")


MAX_LABEL_LENGTH = 256

EARLIEST_DEADLINE = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_DEADLINE = datetime(2200, 1, 1, tzinfo=UTC)
"""A fixed window, not one relative to now: stored specs are validated again when they are
read back, and a spec accepted yesterday must still load tomorrow."""

MAX_DEADLINE_S = 10 * 366 * 86400.0
"""Ten years: a relative deadline beyond it is a unit mistake (ms for s), not a plan."""


class _Strict(SpecModel):
    """Every spec part: see SpecModel (unknown fields, finite floats, storable strings)."""


_MILLICORES = re.compile(r"[0-9]{1,12}m")
"""`500m`: Kubernetes' way of writing half a core. At most 12 digits (a billion cores): a longer
one is no CPU count, and 400 digits divided by 1000 overflowed a float (an API 500)."""


class CpuRange(_Strict):
    """CPU cores a job may use. `min` is guaranteed (request); `max` is the ceiling (limit)."""

    min: Annotated[float, Field(gt=0, le=1024, description="Guaranteed cores (request). Default 1.")] = 1.0
    max: Annotated[
        float | None,
        Field(gt=0, le=1024, description="Most cores the job may be given. Default: the node size."),
    ] = None

    @model_validator(mode="after")
    def _min_le_max(self) -> CpuRange:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is smaller than min ({self.min})")
        return self


class ReplicaRange(_Strict):
    """How many replicas (processes, possibly on different nodes) the job runs, gang-scheduled.

    A policy may resize a running job anywhere in [min, max] (a checkpointed restart at the
    new world size). `batch` says what that does to the batch: `keep_global` keeps the
    global batch (`global_batch` samples a step, split over the replicas: training is the
    same run at any size), `scale` keeps each replica's share (`global_batch / min`) so the
    global batch grows with the replicas and the SDK scales the learning rate linearly.
    The job reads both through `sluice.sdk.elastic()`."""

    min: Annotated[int, Field(ge=1, le=1024)] = 1
    max: Annotated[int | None, Field(ge=1, le=1024)] = None
    batch: Annotated[
        Literal["keep_global", "scale"],
        Field(description="On a resize: keep the global batch (default) or scale it with the replicas."),
    ] = "keep_global"
    global_batch: Annotated[
        int | None,
        Field(ge=1, le=1 << 24, description="Global batch at `min` replicas; default: the job's own (sdk.elastic)."),
    ] = None

    @field_validator("batch", mode="before")
    @classmethod
    def _batch_mode(cls, v: object) -> object:
        if v not in ("keep_global", "scale"):
            raise ValueError(
                f"{shown(v)} is not a batch mode: keep_global (the global batch stays, split over the replicas) "
                "or scale (each replica keeps its batch, the global batch grows with the replicas)"
            )
        return v

    @model_validator(mode="after")
    def _min_le_max(self) -> ReplicaRange:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is smaller than min ({self.min})")
        g = self.global_batch
        if g is not None and self.batch == "keep_global" and g < (self.max or self.min):
            raise ValueError(
                f"global_batch ({g}) is smaller than the most replicas ({self.max or self.min}): "
                "with keep_global every replica needs at least one sample a step"
            )
        if g is not None and self.batch == "scale" and g % self.min:
            raise ValueError(
                f"global_batch ({g}) does not split evenly over min ({self.min}) replicas: "
                "with scale each replica keeps global_batch / min samples a step"
            )
        return self


class Resources(_Strict):
    """Resources per replica."""

    cpu: CpuRange = CpuRange()
    memory_mb: Annotated[int | None, Field(gt=0, le=16 * 1024 * 1024, description="Memory limit in MiB.")] = None
    disk_mb: Annotated[
        int | None,
        Field(
            gt=0,
            le=1024 * 1024 * 1024,
            description="Most its run folder (working folder, HOME, log, checkpoints kept there) may hold on disk, "
            "MiB; measured every disk_check_s while it runs, and past it the job is stopped and fails, not retried "
            "(Kubernetes' ephemeral-storage limit). A bound, not a request: placement does not count it. "
            "Default: none (the node's disk reserve still applies).",
        ),
    ] = None
    gpus: Annotated[int, Field(ge=0, le=64, description="GPUs per replica.")] = 0
    replicas: ReplicaRange = ReplicaRange()

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu_shorthand(cls, v: object) -> object:
        # `cpu: 2` means a request of 2 cores with no explicit ceiling; `cpu: "2"` too, as a
        # spec reads "2" as 2 wherever a number goes.
        if isinstance(v, bool):
            raise ValueError(f"expected a number of cores or {{min, max}}, not {str(v).lower()}")
        if isinstance(v, int | float):
            return {"min": v}
        if isinstance(v, str):
            text = v.strip()
            if _MILLICORES.fullmatch(text):
                cores = int(text[:-1]) / 1000
                raise ValueError(  # `text`, not `v`: the spaces around it may be any length
                    f"{text!r} is a Kubernetes quantity (millicores), which sluice does not read: write {cores:g}"
                )
            try:
                float(text)
            except ValueError:
                raise ValueError(f"expected a number of cores or {{min, max}}, got the text {v[:40]!r}") from None
            return {"min": text}
        return v


class CheckpointSpec(_Strict):
    """Where and how often the job checkpoints. The job itself decides what to save."""

    interval_s: Annotated[float, Field(gt=0, le=86400, description="Seconds between checkpoints the SDK suggests.")] = (
        30.0
    )
    keep: Annotated[int, Field(ge=1, le=100, description="Checkpoints kept per job.")] = 2
    location: Annotated[
        str | None,
        Field(max_length=1024, description="fsspec URL for checkpoints; default under $SLUICE_HOME."),
    ] = None


class QoETarget(_Strict):
    """A quality-of-experience target (DQoES): reach `loss` (or below) and/or finish by a deadline."""

    loss: Annotated[
        float | None,
        Field(ge=-1e12, le=1e12, description="Target loss (finite); reached when a report's loss <= this."),
    ] = None
    deadline_s: Annotated[
        float | None,
        Field(gt=0, le=MAX_DEADLINE_S, description="Seconds after submission to finish by (at most ten years)."),
    ] = None
    deadline: Annotated[
        AwareDatetime | None,
        Field(description="Finish by this time: ISO 8601 with a timezone (or a Unix time), years 2000 to 2199."),
    ] = None

    @field_validator("deadline")
    @classmethod
    def _deadline_window(cls, v: datetime | None) -> datetime | None:
        if v is not None and not EARLIEST_DEADLINE <= v < LATEST_DEADLINE:
            raise ValueError(
                f"{v.isoformat()} is outside the accepted window [{EARLIEST_DEADLINE.date()}, {LATEST_DEADLINE.date()})"
            )
        return v

    @model_validator(mode="after")
    def _something(self) -> QoETarget:
        if self.loss is None and self.deadline_s is None and self.deadline is None:
            raise ValueError("give at least one of loss, deadline_s, deadline")
        return self


class DatasetMount(_Strict):
    """A dataset the job reads through the node cache."""

    REFUSED_AT_SUBMIT: ClassVar[frozenset[str]] = frozenset({"access"})

    name: Name
    access: Annotated[
        str,
        Field(
            pattern="^(random|sequential)$",
            description="Not read by sluice: refused at submit (the job chooses random or streamed reads in "
            "sluice.sdk.dataset); kept so that specs stored with it still load.",
        ),
    ] = "random"


SET_PER_ATTEMPT = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
    }
)
"""Variables sluice sets for each attempt after the spec's env: the GPUs placement gave it (and
the order CUDA counts them in: nvidia-smi's) and a replica's place in its gang (torchrun's
names). A spec's own value would be replaced, so a submit that gives one is refused (checked
at submit: specs stored before still load)."""

JOB_SDK_KNOBS = frozenset({"SLUICE_THREADS", "SLUICE_THREADS_CHECK_S"})
"""SLUICE_* variables a job may set itself: knobs the SDK reads inside the job (thread-pool
resizing, sluice.sdk._threads) and the agent never sets, so no contract value is overridden."""


JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""What a job id given in a spec (`resume_from`, `after`) may look like."""


def job_ref(job_id: str) -> str:
    """A job id as messages name it: as it is when it can be a job id (`job j-1 not found`, the
    way every other message names a job), quoted when not, so that a caller's odd text (a
    newline, a control character) shows as what it is."""
    return job_id if re.fullmatch(JOB_ID_PATTERN, job_id) else repr(job_id)


MAX_AFTER = 16
"""Most jobs one job may be made to wait for (`after` and `after_any` together)."""

MAX_ARRAY = 1000
"""Most jobs one submit may make (`array.count`; Slurm's default MaxArraySize is 1001)."""


class ArraySpec(_Strict):
    """Slurm's `--array`: one submit makes `count` jobs of the same spec, told apart by
    SLUICE_ARRAY_INDEX (0 to count-1) in their environment, at most `parallel` of them
    admitted at once. `id` and `index` are set by sluice on each job it makes."""

    REFUSED_AT_SUBMIT: ClassVar[frozenset[str]] = frozenset({"id", "index"})  # not offered in messages

    count: Annotated[int, Field(ge=1, le=MAX_ARRAY, description="Jobs to make, indexed 0 to count-1.")]
    parallel: Annotated[
        int | None,
        Field(
            ge=1,
            le=MAX_ARRAY,
            description="Most of them admitted (queued or running) at once, the lowest index first "
            "(Slurm's %N). Unset: as many as quota and capacity allow.",
        ),
    ] = None
    id: Annotated[
        str | None,
        Field(pattern=JOB_ID_PATTERN, description="Set by sluice: the array's id; its jobs are <id>-<index>."),
    ] = None
    index: Annotated[
        int | None, Field(ge=0, lt=MAX_ARRAY, description="Set by sluice: this job's index in the array.")
    ] = None


class JobSpec(_Strict):
    """A training job as a tenant submits it."""

    name: Annotated[Name, Field(description="Human name; need not be unique.")] = "job"
    tenant: Annotated[Name | None, Field(description="Owner; defaults to the caller's tenant.")] = None
    queue: Annotated[Name, Field(description="A queue the tenant is granted (docs/queues.md).")] = "default"
    command: Annotated[
        list[str],
        Field(min_length=1, max_length=MAX_ARGV_ITEMS, description="argv list, run without a shell."),
    ]
    workdir: Annotated[
        str | None, Field(max_length=4096, description="Working directory; default the spec's folder.")
    ] = None
    env: Annotated[dict[str, str], Field(max_length=256)] = {}
    resources: Resources = Resources()
    datasets: Annotated[list[DatasetMount], Field(max_length=16)] = []
    checkpoint: CheckpointSpec = CheckpointSpec()
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    max_runtime_s: Annotated[
        float | None,
        Field(
            gt=0,
            le=MAX_RUNTIME_S,
            description="Most seconds the job may run (Starting or Running), summed over its attempts; time "
            "queued, suspended or stopping is not counted. Past it the job is stopped through its checkpoint "
            "and ends Failed. Unset: no limit.",
        ),
    ] = None
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    priority_class: Annotated[
        Name | None,
        Field(
            description="A priority class an admin defined (docs/queues.md); the job's priority is its value.",
        ),
    ] = None
    qoe: QoETarget | None = None
    labels: Annotated[dict[str, str], Field(max_length=64)] = {}
    after: Annotated[
        list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]],
        Field(
            max_length=MAX_AFTER,
            description="Jobs (or job arrays: every job of one) of the same tenant this one starts after: it "
            "waits (Pending) until each has Succeeded, and is cancelled, never started, if one ends otherwise.",
        ),
    ] = []
    after_any: Annotated[
        list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]],
        Field(
            max_length=MAX_AFTER,
            description="Jobs (or job arrays: every job of one) of the same tenant this one starts after "
            "whatever their end (Slurm's afterany): it waits (Pending) until each has ended, Succeeded, "
            "Failed or Cancelled, then starts. A gather after a sweep of which some runs failed.",
        ),
    ] = []
    array: Annotated[
        ArraySpec | None,
        Field(description="Make `count` jobs of this spec at once (a job array); see ArraySpec."),
    ] = None
    resume_from: Annotated[
        str | None,
        Field(
            pattern=JOB_ID_PATTERN,
            description="Start from the newest checkpoint of this finished, cancelled or suspended job "
            "of the same tenant.",
        ),
    ] = None

    @field_validator("after", "after_any")
    @classmethod
    def _after_once_each(cls, v: list[str]) -> list[str]:
        twice = sorted({x for x in v if v.count(x) > 1})
        if twice:
            raise ValueError(f"{shown(twice[0])} is given more than once")
        return v

    @field_validator("after_any")
    @classmethod
    def _after_one_way_each(cls, v: list[str], info: ValidationInfo) -> list[str]:
        after = info.data.get("after", [])  # validated before it (declared first)
        both = sorted(set(after) & set(v))
        if both:
            raise ValueError(f"{shown(both[0])} is also in after; a job waits for another one way")
        if len(after) + len(v) > MAX_AFTER:
            raise ValueError(f"after and after_any name at most {MAX_AFTER} jobs together")
        return v

    @property
    def predecessors(self) -> list[str]:
        """Every job or array id this job starts after, either way (`after`, then `after_any`)."""
        return [*self.after, *self.after_any]

    @field_validator("labels")
    @classmethod
    def _label_sizes(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not key or len(key) > MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
                raise ValueError(f"{key[:40]!r}: label names and values are 1 to {MAX_LABEL_LENGTH} characters")
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _argv_not_shell(cls, v: object) -> object:
        if isinstance(v, str):
            raise ValueError(
                "must be a list of arguments (argv), not a shell string; "
                'write ["python", "train.py"] instead of "python train.py"'
            )
        return v

    @field_validator("command")
    @classmethod
    def _argv_items(cls, v: list[str]) -> list[str]:
        for i, arg in enumerate(v):
            if len(arg) > MAX_ARG_LENGTH:
                raise ValueError(f"argument {i} is longer than {MAX_ARG_LENGTH} characters")
            if "\x00" in arg:
                raise ValueError(f"argument {i} contains a NUL byte")
        if not v[0]:
            raise ValueError("the program (first item) is empty")
        if v[0] in {"sh", "bash", "/bin/sh", "/bin/bash", "zsh", "dash"} and "-c" in v[1:2]:
            raise ValueError("a shell with -c is a shell string in disguise; give the program's argv")
        if " " in v[0] and _SHELL_META.search(v[0]) is None and len(v) == 1:
            raise ValueError("the first item contains spaces; it looks like a shell string, give a list of arguments")
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key):
                raise ValueError(f"{shown(key)} is not a valid environment variable name")
            if key.startswith("SLUICE_") and key not in JOB_SDK_KNOBS:
                raise ValueError(
                    f"{key!r}: SLUICE_* variables are set by sluice itself "
                    f"(a job may set only {', '.join(sorted(JOB_SDK_KNOBS))})"
                )
            if key == "SLUICE_THREADS" and value not in ("auto", "manual"):
                raise ValueError(f"{key!r} must be 'auto' (follow the CPU allocation) or 'manual' (the job's own)")
            if key == "SLUICE_THREADS_CHECK_S" and not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
                raise ValueError(f"{key!r} must be a number of seconds, not {value[:40]!r}")
            if len(value) > 32768 or "\x00" in value:
                raise ValueError(f"{key!r}: value too long or contains NUL")
        return v
