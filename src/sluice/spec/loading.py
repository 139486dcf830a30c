"""Turning YAML/JSON text into validated specs, with every problem named by its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from sluice.spec.errors import FieldProblem, SpecError
from sluice.spec.job import JobSpec

MAX_SPEC_BYTES = 256 * 1024
"""Specs are small; anything bigger is a mistake or an attack and is refused before parsing."""

M = TypeVar("M", bound=BaseModel)


def _problems(err: ValidationError) -> list[FieldProblem]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        msg = msg.removeprefix("Value error, ")
        out.append(FieldProblem(loc or "(spec)", msg))
    return out


def parse_model(model: type[M], data: Any) -> M:
    """Validate `data` as `model`, converting pydantic's errors into a SpecError."""
    if not isinstance(data, dict):
        raise SpecError([FieldProblem("(spec)", f"expected a mapping, got {type(data).__name__}")])
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(_problems(err)) from None


def parse_job_spec(data: Any) -> JobSpec:
    return parse_model(JobSpec, data)


def load_yaml_text(text: str | bytes) -> Any:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([FieldProblem("(spec)", f"larger than {MAX_SPEC_BYTES // 1024} KiB")])
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError([FieldProblem("(spec)", f"not valid YAML: {err}")]) from None


def load_spec_file(path: str | Path) -> Any:
    """Read a YAML/JSON spec file into plain data (not validated)."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as err:
        raise SpecError([FieldProblem("(file)", f"cannot read {p}: {err.strerror}")]) from None
    if size > MAX_SPEC_BYTES:
        raise SpecError([FieldProblem("(spec)", f"larger than {MAX_SPEC_BYTES // 1024} KiB")])
    return load_yaml_text(p.read_bytes())


def load_job_spec(path: str | Path) -> JobSpec:
    """Load and validate a job spec file; a relative `workdir` is taken from the file's folder."""
    data = load_spec_file(path)
    if isinstance(data, dict) and "workdir" not in data:
        data = {**data, "workdir": str(Path(path).resolve().parent)}
    elif isinstance(data, dict) and isinstance(data.get("workdir"), str):
        wd = Path(data["workdir"])
        if not wd.is_absolute():
            data = {**data, "workdir": str((Path(path).resolve().parent / wd).resolve())}
    return parse_job_spec(data)
