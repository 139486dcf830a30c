"""Pages for every list endpoint: `?limit=` and an opaque `?cursor=`, answered with
`{"items": [...], "next_cursor": "..." | null}`.

Cursors are keyset positions (the sort key of the last item sent), not offsets: a job
submitted or a tenant deleted between two requests neither repeats nor skips an item. They
are base64url JSON tagged with the list they belong to, so a cursor from one list handed to
another is a 422 naming `cursor`, not a silently wrong page.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR_CHARS = 1024
MAX_PAGE_BYTES = 4 * 1024 * 1024
"""About the most one page holds (bytes, as its items estimate themselves): a page ends early,
with a cursor, rather than carry a thousand 1 MiB job specs (about 1 GB, built in memory)."""

T = TypeVar("T")

LimitQ = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"Most items per page (1 to {MAX_LIMIT}).")]
CursorQ = Annotated[
    str | None,
    Query(max_length=MAX_CURSOR_CHARS, description="`next_cursor` of the previous page; omit for the first page."),
]


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; null on the last page."
    )


def encode_cursor(kind: str, key: Sequence[Any]) -> str:
    raw = json.dumps({"k": kind, "v": list(key)}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def bad_cursor(problem: str) -> RequestValidationError:
    """The same 422 shape FastAPI gives a bad query parameter, naming `cursor`."""
    return RequestValidationError([{"type": "value_error", "loc": ("query", "cursor"), "msg": problem, "input": None}])


def decode_cursor(kind: str, cursor: str | None, types: Sequence[type]) -> tuple[Any, ...] | None:
    """The key a cursor of list `kind` holds (typed as `types`), None for no cursor."""
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):
        raise bad_cursor("not a cursor this API gave out") from None
    if not isinstance(data, dict) or data.get("k") != kind or not isinstance(data.get("v"), list):
        raise bad_cursor(f"not a cursor of the {kind} list")
    values = data["v"]
    if len(values) != len(types) or not all(_is(v, t) for v, t in zip(values, types, strict=True)):
        raise bad_cursor(f"not a cursor of the {kind} list")
    return tuple(float(v) if t is float else v for v, t in zip(values, types, strict=True))


_INT64 = (-(2**63), 2**63 - 1)
"""What the store can hold in an INTEGER: a cursor's int outside it was never given out."""


def _is(value: Any, t: type) -> bool:
    """`value` is a `t` the store can take. A cursor is the client's input: an int past 64
    bits (OverflowError in SQLite), a lone surrogate (UnicodeEncodeError) or a NaN would
    otherwise reach the store and come back as a 500 with a traceback in the log."""
    if t is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value <= _INT64[1]
    if t is str:
        return isinstance(value, str) and _encodable(value)
    return isinstance(value, t)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def page_of(
    items: Sequence[T],
    limit: int,
    kind: str,
    key: Callable[[T], Sequence[Any]],
    size: Callable[[T], int] | None = None,
) -> tuple[list[T], str | None]:
    """Cut `items` (up to limit + 1 fetched, in key order) to a page and its next cursor.
    With `size` (an item's bytes, estimated), the page also ends once it would pass
    MAX_PAGE_BYTES; it always holds at least one item."""
    end = min(len(items), limit)
    if size is not None:
        total = 0
        for i in range(end):
            total += size(items[i])
            if total > MAX_PAGE_BYTES and i > 0:
                end = i
                break
    page = list(items[:end])
    if end == len(items):
        return page, None
    return page, encode_cursor(kind, key(page[-1]))
