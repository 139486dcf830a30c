"""The base every spec model shares: strict about unknown fields, non-finite numbers and
strings that no store or log can hold.

JSON has no NaN or Infinity, yet Python's JSON parser and YAML accept them; a NaN CPU request
compares false with everything and silently breaks every capacity sum, so they are refused at
the door. Strings with a NUL byte or a lone UTF-16 surrogate (legal in a JSON string escape)
cannot be stored by PostgreSQL, encoded to UTF-8 or passed to exec; they are refused with the
field that holds them instead of failing deep inside the store.

YAML's `true`/`false` are refused where a number is expected: Python counts a bool as an
int, so `min: true` would otherwise be read as 1 core. Names (jobs, tenants, queues, priority
classes, datasets) share one type, `Name`, whose error says what a name may hold.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, WithJsonSchema, field_validator

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
"""DNS-label-like names: safe in paths, URLs and cgroup names."""

NAME_RULE = "use 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"
_NAME = re.compile(NAME_PATTERN)
_SHOWN_CHARS = 40
"""A longer offending value is cut in the message: the user knows the rest."""


def check_name(value: str) -> str:
    """`value` if it is a valid name, else a ValueError that says what a name may hold."""
    if _NAME.fullmatch(value) is None:
        shown = repr(value) if len(value) <= _SHOWN_CHARS else f"{value[:_SHOWN_CHARS]!r}... ({len(value)} characters)"
        raise ValueError(f"{shown} is not a valid name: {NAME_RULE}")
    return value


def _check_name_or_empty(value: str) -> str:
    return value if value == "" else check_name(value)


Name = Annotated[str, AfterValidator(check_name), WithJsonSchema({"type": "string", "pattern": NAME_PATTERN})]
"""A job, tenant, queue, cohort, priority class or dataset name (NAME_PATTERN)."""

NameOrEmpty = Annotated[
    str, AfterValidator(_check_name_or_empty), WithJsonSchema({"type": "string", "pattern": "^$|" + NAME_PATTERN})
]
"""A name, or "" to clear one (a queue's cohort)."""


def check_text(value: Any) -> None:
    """Raise ValueError if `value` (or a string inside a list or mapping) cannot be stored."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("contains a NUL byte")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("is not valid Unicode text (lone surrogate)") from None
    elif isinstance(value, Mapping):
        for k, v in value.items():
            check_text(k)
            check_text(v)
    elif isinstance(value, list | tuple):
        for v in value:
            check_text(v)


def _is_number_type(annotation: Any) -> bool:
    """True for int, float and their optional forms (`float | None`); bool fields are not numbers."""
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return bool({int, float} & set(members)) and bool not in members


@cache
def _number_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, f in model.model_fields.items() if _is_number_type(f.annotation))


def _is_bool_type(annotation: Any) -> bool:
    members = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return bool in members


@cache
def _bool_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, f in model.model_fields.items() if _is_bool_type(f.annotation))


MAX_RUNTIME_S = 366 * 86400.0
"""The largest `max_runtime_s` of a job or queue (a year and a day): a bound, like every
other number's."""


def shown(v: Any) -> str:
    """`v` quoted for a refusal, cut after _SHOWN_CHARS characters (a refused env name or batch
    mode came back whole in the 422, however long)."""
    text = repr(v)
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}..."


class SpecModel(BaseModel):
    """Frozen, unknown fields refused, floats finite, booleans no numbers, every string storable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)

    REFUSED_AT_SUBMIT: ClassVar[frozenset[str]] = frozenset()
    """Fields kept only so that stored specs still load; a submit giving one is refused, so the
    list of a part's fields in an error message leaves them out."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads True as 1; its strict mode would also refuse "2", which
        # specs accept today, so only booleans are refused here, before the number is parsed.
        if isinstance(v, bool) and info.field_name in _number_fields(cls):
            raise ValueError(f"expected a number, not {str(v).lower()}")
        return v

    @field_validator("*")
    @classmethod
    def _storable_text(cls, v: Any) -> Any:
        check_text(v)
        return v


MIN_WEIGHT = 0.001
"""Smallest fair-share weight (tenants, queues): a million to one against the largest, 1000.
Smaller ones (1e-300) are typos that make every share computed from them 0 or overflow."""
MAX_WEIGHT = 1000.0


class RequestModel(SpecModel):
    """An admin's request that changes who may do what (tenants, queues, grants, priority
    classes): types exactly as written. A boolean field takes only true/false (`"yes"` or 1 is
    refused, so `{"admin": "yes"}` cannot make an admin) and a number field only a number
    (`"2"` is refused), besides SpecModel's rules. Job and dataset specs keep accepting "2"."""

    @field_validator("*", mode="before")
    @classmethod
    def _exact_types(cls, v: Any, info: ValidationInfo) -> Any:
        name = info.field_name
        if v is None:
            return v
        if name in _bool_fields(cls) and not isinstance(v, bool):
            raise ValueError(f"expected true or false, not {shown(v)}")
        if name in _number_fields(cls) and not isinstance(v, int | float):
            raise ValueError(f"expected a number, not {shown(v)}")
        return v
