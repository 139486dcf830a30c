"""DatasetSpec: a named dataset whose bytes live at a source URL and are cached near jobs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from sluice.spec.base import Name, SpecModel

ALLOWED_SCHEMES = ("file", "local", "s3", "http", "https", "memory")


class DatasetSpec(SpecModel):
    """A dataset as a tenant declares it."""

    name: Name
    tenant: Name | None = None
    source: Annotated[str, Field(min_length=1, max_length=4096, description="fsspec URL or local path.")]
    format: Annotated[str, Field(pattern="^(files|blocks)$", description="Raw files, or pre-merged blocks.")] = "files"
    cache: Annotated[bool, Field(description="Cache on nodes that run jobs reading it.")] = True
    storage_options: Annotated[dict[str, str], Field(max_length=32)] = {}

    @field_validator("source")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if "://" in v:
            scheme = v.split("://", 1)[0].lower()
            if scheme not in ALLOWED_SCHEMES:
                raise ValueError(f"scheme {scheme!r} is not supported; use one of {', '.join(ALLOWED_SCHEMES)}")
        return v
