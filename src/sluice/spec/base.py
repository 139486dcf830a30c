"""The base every spec model shares: strict about unknown fields, non-finite numbers and
strings that no store or log can hold.

JSON has no NaN or Infinity, yet Python's JSON parser and YAML accept them; a NaN CPU request
compares false with everything and silently breaks every capacity sum, so they are refused at
the door. Strings with a NUL byte or a lone UTF-16 surrogate (legal in a JSON string escape)
cannot be stored by PostgreSQL, encoded to UTF-8 or passed to exec; they are refused with the
field that holds them instead of failing deep inside the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


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


class SpecModel(BaseModel):
    """Frozen, unknown fields refused, floats finite, every string storable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _storable_text(cls, v: Any) -> Any:
        check_text(v)
        return v
