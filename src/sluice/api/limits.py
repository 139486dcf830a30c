"""Refuse requests before anything parses them: oversized bodies (`BodyLimit`), and every
change once the plane lost its database to another (`WritesHalted`).

A pure ASGI middleware: a declared Content-Length over the limit is answered 413 without
reading a byte; otherwise the body is read up to the limit (a chunked or lying client is cut
off there) and replayed to the app. API bodies are specs and small forms, so buffering them
costs nothing and keeps the app's own parsing simple.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        payload = json.dumps(
            {"error": "too large", "detail": f"request body is larger than the limit of {self.max_bytes} bytes"}
        ).encode()
        headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class WritesHalted:
    """Refuse every request that would change something (any method but GET, HEAD, OPTIONS)
    once the plane lost its database to another plane (`ControlPlane.lost_database`): its
    book is stale from then on — the other plane's jobs are not in it — so a cancel, a submit,
    a delete judged against it could act on what it no longer knows (red team s29). A 503
    saying why; reads go on, answering from what this plane last knew."""

    def __init__(self, app: ASGIApp, halted: Any) -> None:
        self.app = app
        self.halted = halted
        """A callable: why writes are refused now, or None while they are not."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = None if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS") else self.halted()
        if why is None:
            await self.app(scope, receive, send)
            return
        payload = json.dumps(
            {
                "error": "unavailable",
                "detail": f"this plane no longer acts on jobs ({why}); nothing was changed: ask the plane now serving",
            }
        ).encode()
        headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def tenant_slot(request: Request, kind: str, tenant: str, most: int) -> Callable[[], None] | None:
    """One of the tenant's `most` slots of `kind` (log streams, downloads, listings: responses
    that hold a file or a worker thread while the client reads), as the function that gives it
    back (once, however often called), or None when all are in use. Counted on the event loop's
    thread (the routes that take one are async), so no lock is needed."""
    held: dict[str, int] | None = getattr(request.app.state, kind, None)
    if held is None:
        held = {}
        setattr(request.app.state, kind, held)
    if held.get(tenant, 0) >= most:
        return None
    held[tenant] = held.get(tenant, 0) + 1
    done = False

    def release() -> None:
        nonlocal done
        if not done:
            done = True
            held[tenant] -= 1
            if held[tenant] <= 0:
                del held[tenant]

    return release
