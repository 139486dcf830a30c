"""DatasetSpec: a named dataset whose bytes live at a source URL and are cached near jobs."""

from __future__ import annotations

import math
import posixpath
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, PlainValidator, WithJsonSchema, field_validator

from sluice.spec.base import Name, SpecModel

SOURCE_SCHEMES = ("file", "local", "http", "https", "s3")
"""The URL schemes sluice lists and fetches on a tenant's behalf (data/guard.py checks the same
list). `memory://` is not one: it would be the plane's own process memory, shared by every
tenant."""

LOCAL_SCHEMES = ("file", "local")

MAX_OPTION_NAME = 64
MAX_OPTION_TEXT = 4096
MAX_OPTION_INT = 2**53
"""Bounds of a storage option: its name's length, a string value's length, an integer's size
(what a JSON number holds exactly)."""


def check_option_value(v: Any) -> str | bool | int | float:
    """A storage option's value if it is a scalar sluice passes on: a string of at most
    MAX_OPTION_TEXT characters, a boolean, an integer within +-MAX_OPTION_INT or a finite float.
    Mappings, lists and null are refused, so no client or config object (a proxy, a connector)
    rides in through a value; which names and types each protocol takes is the source guard's
    business (data/guard.py)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        if abs(v) > MAX_OPTION_INT:
            raise ValueError(f"must be a number of at most {MAX_OPTION_INT} in size")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v
    if isinstance(v, str):
        if len(v) > MAX_OPTION_TEXT:
            raise ValueError(f"longer than {MAX_OPTION_TEXT} characters")
        return v
    kind = {dict: "a mapping", list: "a list", type(None): "null"}.get(type(v), type(v).__name__)
    raise ValueError(f"must be a string, a boolean or a number, not {kind}")


OptionValue = Annotated[
    str | bool | int | float,
    PlainValidator(check_option_value),
    WithJsonSchema(
        {"anyOf": [{"type": "string", "maxLength": MAX_OPTION_TEXT}, {"type": "boolean"}, {"type": "number"}]}
    ),
]
"""A storage option's value (check_option_value)."""


def local_path(source: str) -> str | None:
    """The path of a local source (a plain path, `file://` or `local://`), else None."""
    if "://" not in source:
        return source
    scheme, rest = source.split("://", 1)
    return rest if scheme.lower() in LOCAL_SCHEMES else None


def relative_local_source(source: str) -> bool:
    """True for a local source given as a relative path (`digits`, `./data`, `file://digits`)."""
    path = local_path(source)
    return path is not None and not posixpath.isabs(path)


def source_has_password(source: str) -> bool:
    """True for a network source URL that carries a password (`https://user:pw@host/...`): a
    credential, like the storage options `key`, `secret` and `token`."""
    if local_path(source) is not None:
        return False
    try:
        return urlsplit(source).password is not None
    except ValueError:
        return False


def shown_source(source: str) -> str:
    """The source as the API shows it: a password in the URL is written `***` (the user stays),
    as storage options are shown by name only."""
    if not source_has_password(source):
        return source
    parts = urlsplit(source)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


class DatasetSpec(SpecModel):
    """A dataset as a tenant declares it."""

    name: Name
    tenant: Name | None = None
    source: Annotated[
        str,
        Field(
            min_length=1,
            max_length=4096,
            description="fsspec URL (s3://, http(s)://, file://) or absolute local path; in a spec file "
            "the CLI takes a relative path from the file's folder.",
        ),
    ]
    format: Annotated[
        str,
        Field(
            pattern="^(files|blocks)$",
            description="Raw files (the only format sluice reads; blocks is refused at create, kept so that "
            "datasets stored with it still load).",
        ),
    ] = "files"
    cache: Annotated[
        bool,
        Field(
            description="Jobs read every dataset through the node cache: false is refused at create (kept so "
            "that datasets stored with it still load).",
        ),
    ] = True
    storage_options: Annotated[
        dict[str, OptionValue],
        Field(max_length=32, description="fsspec options: strings, booleans or numbers (e.g. anon: true)."),
    ] = {}

    @field_validator("source")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" in v:
            scheme = v.split("://", 1)[0].lower()
            if scheme not in SOURCE_SCHEMES:
                raise ValueError(f"scheme {scheme!r} is not supported; use one of {', '.join(SOURCE_SCHEMES)}")
        return v

    @field_validator("storage_options")
    @classmethod
    def _option_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if not key or len(key) > MAX_OPTION_NAME:
                raise ValueError(f"option name {key[:MAX_OPTION_NAME]!r}: 1 to {MAX_OPTION_NAME} characters")
        return v
