"""Turning YAML/JSON text into validated specs, with every problem named by its field."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from sluice.spec.base import SpecModel
from sluice.spec.dataset import DatasetSpec, local_path
from sluice.spec.errors import FieldProblem, SpecError
from sluice.spec.job import JobSpec
from sluice.spec.overrides import apply_overrides

MAX_SPEC_BYTES = 1024 * 1024
"""Specs are small; anything bigger is a mistake or an attack and is refused before parsing."""

M = TypeVar("M", bound=BaseModel)


def _problems(err: ValidationError) -> list[FieldProblem]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        out.append(FieldProblem(loc or "(spec)", problem_words(e)))
    return out


def _spec_models() -> dict[str, type[SpecModel]]:
    """Every spec model by class name, to name a mapping's fields in an error."""
    found: dict[str, type[SpecModel]] = {}
    todo: list[type[SpecModel]] = [SpecModel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.setdefault(sub.__name__, sub)
            todo.append(sub)
    return found


def given(value: Any) -> str:
    """What a user wrote, in words, for an error message (a long text is cut)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value!r}" if len(value) <= 40 else f"the text {value[:40]!r}..."
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def problem_words(e: Mapping[str, Any]) -> str:
    """One pydantic error entry in a user's words: pydantic's own, except where they name our
    classes (`Input should be a valid dictionary or instance of CpuRange`) or its internals."""
    kind, msg = e.get("type", ""), str(e.get("msg", "invalid"))
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind in ("model_type", "dict_type"):
        model = _spec_models().get(str(e.get("ctx", {}).get("class_name", "")))
        named = [f for f in model.model_fields if f not in model.REFUSED_AT_SUBMIT] if model is not None else []
        fields = f" (fields: {', '.join(named)})" if named else ""
        return f"expected a mapping{fields}, got {given(e.get('input'))}"
    if kind == "model_attributes_type":
        # What an API body gets for the same mistake (FastAPI validates from attributes): the
        # class is not named, so no fields are listed, but it is no "valid dictionary or
        # object to extract fields from" either (`"array": 8` through the API said that).
        return f"expected a mapping, got {given(e.get('input'))}"
    if kind == "string_pattern_mismatch" and tuple(e.get("loc", ()))[-1:] == ("resume_from",):
        return f"{given(e.get('input'))} is not a job id (like j-1a2b3c4d5e, as `sluice job list` shows it)"
    if kind == "string_type" and isinstance(e.get("input"), bool | int | float):
        value = e["input"]
        written = str(value).lower() if isinstance(value, bool) else str(value)
        return f'expected text, got {given(value)}: quote it ("{written}")'
    return msg.removeprefix("Value error, ")


def parse_model(model: type[M], data: Any) -> M:
    """Validate `data` as `model`, converting pydantic's errors into a SpecError."""
    if data is None:
        raise SpecError([FieldProblem("(spec)", "the spec is empty: expected a mapping of fields")])
    if not isinstance(data, dict):
        raise SpecError([FieldProblem("(spec)", f"expected a mapping of fields, got {given(data)}")])
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise SpecError(_problems(err)) from None


def parse_job_spec(data: Any) -> JobSpec:
    return parse_model(JobSpec, data)


def _yaml_problem(err: yaml.YAMLError) -> str:
    """The parser's complaint with the line and column it points at (1-based)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is not None:
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
    return f"not valid YAML: {what}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping: PyYAML keeps the last value,
    so `priority: 1` then `priority: 2` would silently be priority 2. Keys a merge (`<<`)
    brings in may still be overridden, as YAML means them to be."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                seen = first.setdefault(key, key_node.start_mark)
            except TypeError:
                continue  # an unhashable key: the base class refuses it
            if seen is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {seen.line + 1})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str | bytes) -> Any:
    """yaml.safe_load that refuses a key repeated in one mapping (yaml.YAMLError saying
    `duplicate key ...`): for every YAML file a user writes, specs and settings.yaml alike."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects


def load_yaml_text(text: str | bytes) -> Any:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError([FieldProblem("(spec)", f"larger than {MAX_SPEC_BYTES // 1024} KiB")])
    try:
        return safe_load_unique(text)
    except yaml.YAMLError as err:
        raise SpecError([FieldProblem("(spec)", _yaml_problem(err))]) from None
    except RecursionError:
        raise SpecError([FieldProblem("(spec)", "nested too deeply")]) from None


def read_spec_bytes(path: str | Path) -> bytes:
    """The bytes of a spec file: a regular file of at most MAX_SPEC_BYTES, else a SpecError.

    Checked on the opened descriptor, not the name, and read with a cap rather than trusting
    the size the file reports: `/dev/zero`, a FIFO, a directory or a file growing while it is
    read would otherwise hang or exhaust memory.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise SpecError([FieldProblem("(file)", f"cannot read {p}: {err.strerror}")]) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise SpecError([FieldProblem("(file)", f"{p} is a directory, not a spec file")])
        if not stat.S_ISREG(mode):
            raise SpecError([FieldProblem("(file)", f"{p} is not a regular file (a device, FIFO or socket)")])
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as err:
        raise SpecError([FieldProblem("(file)", f"cannot read {p}: {err.strerror}")]) from None
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError([FieldProblem("(spec)", f"{p} is larger than {MAX_SPEC_BYTES // 1024} KiB")])
    return data


def load_spec_file(path: str | Path) -> Any:
    """Read a YAML/JSON spec file into plain data (not validated)."""
    return load_yaml_text(read_spec_bytes(path))


def load_job_spec(path: str | Path, overrides: Iterable[tuple[str, Any]] = ()) -> JobSpec:
    """Load and validate a job spec file; a relative `workdir` is taken from the file's folder.
    `overrides`: (dotted field path, value) set in the file's mapping first (`--set`, `--env`)."""
    data = load_spec_file(path)
    changes = list(overrides)
    if changes and isinstance(data, dict):
        data = apply_overrides(data, changes)
    if isinstance(data, dict) and "workdir" not in data:
        data = {**data, "workdir": str(Path(path).resolve().parent)}
    elif isinstance(data, dict) and isinstance(data.get("workdir"), str):
        if data["workdir"].startswith("~"):  # it became <spec folder>/~/x
            problem = (
                f"{data['workdir']!r}: sluice does not expand '~' (no shell reads a spec); write the absolute path"
            )
            raise SpecError([FieldProblem("workdir", problem)])
        wd = Path(data["workdir"])
        if not wd.is_absolute():
            data = {**data, "workdir": str((Path(path).resolve().parent / wd).resolve())}
    return parse_job_spec(data)


def load_dataset_spec(path: str | Path) -> DatasetSpec:
    """Load and validate a dataset spec file; a relative local `source` (`digits`, `./data`,
    `file://data`) is taken from the file's folder, as a job spec's `workdir` is, and `~` is
    the caller's home. The API, which has no file, refuses a relative source."""
    data = load_spec_file(path)
    src = data.get("source") if isinstance(data, dict) else None
    src = src.strip() if isinstance(src, str) else ""
    rel = local_path(src) if src else None
    if rel is not None:
        full = os.path.expanduser(rel)
        if not os.path.isabs(full):
            full = os.path.normpath(Path(path).resolve().parent / full)
        if full != rel:
            prefix = src.split("://", 1)[0] + "://" if "://" in src else ""
            data = {**data, "source": prefix + full}
    return parse_model(DatasetSpec, data)
