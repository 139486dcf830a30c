"""What one HTTP connection may cost the server, whoever opens it (no token needed to connect).

uvicorn keeps a connection whose request headers never complete for as long as the client
likes — one that sends nothing, or a byte every few seconds ("slowloris"). Twenty thousand of
them, opened from loopback without a token, held every descriptor the plane had: `/healthz`
and every tenant's requests timed out, and asyncio logged a traceback per failed `accept`,
6 MB of server.log a second (red-team pass 5). So:

- `BoundedH11Protocol` gives each connection `header_timeout_s` to complete a request —
  its headers and its body — from when it opens, and again after each response on a
  kept-alive connection, then closes it (a request whose body never came held its
  connection for good: red-team pass 6);
- `AcceptErrorsOnce` lets one "out of system resource" accept error per minute into the log
  (the count of the ones it held back goes with the next);
- the server raises its own descriptor limit to the hard one.

No cap on connections: uvicorn's `limit_concurrency` counts idle connections too, so 2,100
silent ones (each closed after 10 s, reopened at ~200 a second) made every request a 503
(red-team pass 6) — far cheaper than filling the descriptor table, which the deadline makes
take ~2,000 new connections a second.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

ACCEPT_ERROR_EVERY_S = 60.0
"""At most one logged accept failure per this many seconds (s)."""


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request (its headers and its body)."""

    header_timeout_s: float = 10.0
    """Set by `protocol_with` for each server: seconds a connection has to send a request."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._arm()

    def on_response_complete(self) -> None:
        finished = self.cycle
        # uvicorn starts a pipelined request already received inside this call: its cycle is
        # not the one that waits for headers, and must not be what the deadline watches (it
        # closed a pipelined followed log 10 s into its answer).
        super().on_response_complete()
        self._arm(finished)  # a kept-alive connection has as long for the next request

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm(self, waiting: Any = None) -> None:
        """`waiting`: the cycle that is current until the next request's headers are complete
        (none on a new connection, the finished one after a response)."""
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._too_slow, waiting)

    def _too_slow(self, cycle_then: Any) -> None:
        if self.transport.is_closing():
            return
        # No request's headers in time, or headers but not yet the body they announced:
        # nothing to answer yet, so nothing is lost by closing.
        if self.cycle is cycle_then or self.conn.their_state is h11.SEND_BODY:
            self.transport.close()


def protocol_with(header_timeout_s: float) -> type[BoundedH11Protocol]:
    """The protocol class for one server (uvicorn takes a class, not an instance)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})


class AcceptErrorsOnce(logging.Filter):
    """Lets asyncio's 'socket.accept() out of system resource' through once per
    `ACCEPT_ERROR_EVERY_S`; every other record passes."""

    def __init__(self, every_s: float = ACCEPT_ERROR_EVERY_S) -> None:
        super().__init__()
        self.every_s = every_s
        self._last = float("-inf")
        self._held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "socket.accept() out of system resource" not in str(record.msg):
            return True
        now = time.monotonic()
        if now - self._last < self.every_s:
            self._held += 1
            return False
        self._last = now
        if self._held:
            record.msg = f"{record.msg} ({self._held} more since the last one logged)"
            self._held = 0
        record.exc_info = None  # the same traceback every time: the message says it
        return True


def raise_descriptor_limit() -> int:
    """Raise this process's open-file limit to its hard limit; returns the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft
