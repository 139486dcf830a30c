"""JobSpec: what a tenant asks sluice to run.

Every field is optional except `command`. Unknown fields are rejected rather than ignored,
because a misspelt `max_restarts` silently ignored is a job that is not retried.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
"""DNS-label-like names: safe in paths, URLs and cgroup names."""

MAX_ARGV_ITEMS = 256
MAX_ARG_LENGTH = 8192

_SHELL_META = re.compile(r"[;&|`$<>]|\$\(|&&|\|\|")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


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
    """How many replicas (processes, possibly on different nodes) the job runs, gang-scheduled."""

    min: Annotated[int, Field(ge=1, le=1024)] = 1
    max: Annotated[int | None, Field(ge=1, le=1024)] = None

    @model_validator(mode="after")
    def _min_le_max(self) -> ReplicaRange:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is smaller than min ({self.min})")
        return self


class Resources(_Strict):
    """Resources per replica."""

    cpu: CpuRange = CpuRange()
    memory_mb: Annotated[int | None, Field(gt=0, le=16 * 1024 * 1024, description="Memory limit in MiB.")] = None
    gpus: Annotated[int, Field(ge=0, le=64, description="GPUs per replica.")] = 0
    replicas: ReplicaRange = ReplicaRange()

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu_shorthand(cls, v: object) -> object:
        # `cpu: 2` means a request of 2 cores with no explicit ceiling.
        if isinstance(v, int | float) and not isinstance(v, bool):
            return {"min": v}
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

    loss: Annotated[float | None, Field(description="Target loss; reached when a report's loss <= this.")] = None
    deadline_s: Annotated[float | None, Field(gt=0, description="Seconds after submission to finish by.")] = None
    deadline: datetime | None = None

    @model_validator(mode="after")
    def _something(self) -> QoETarget:
        if self.loss is None and self.deadline_s is None and self.deadline is None:
            raise ValueError("give at least one of loss, deadline_s, deadline")
        return self


class DatasetMount(_Strict):
    """A dataset the job reads through the node cache."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    access: Annotated[str, Field(pattern="^(random|sequential)$")] = "random"


class JobSpec(_Strict):
    """A training job as a tenant submits it."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, description="Human name; need not be unique.")] = "job"
    tenant: Annotated[
        str | None, Field(pattern=NAME_PATTERN, description="Owner; defaults to the caller's tenant.")
    ] = None
    queue: Annotated[str, Field(pattern=NAME_PATTERN)] = "default"
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
    priority: Annotated[int, Field(ge=-1000, le=1000)] = 0
    qoe: QoETarget | None = None
    labels: Annotated[dict[str, str], Field(max_length=64)] = {}

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
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key.startswith("SLUICE_"):
                raise ValueError(f"{key!r}: SLUICE_* variables are set by sluice itself")
            if len(value) > 32768 or "\x00" in value:
                raise ValueError(f"{key!r}: value too long or contains NUL")
        return v
