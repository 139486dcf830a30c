"""What sluice's stand-in remote servers share: an aiohttp app on its own thread and event
loop, and the network shaping (per-request latency, bandwidth) this machine cannot add.

These machines have no netem, so a "remote" source is a loopback server that waits before
answering and paces the body it sends. The file server (`httpserve.DataServer`) and the
shaping proxy in front of an S3 server (`s3proxy.ShapingProxy`) both build on this, so both
shape traffic the same way.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

CHUNK_BYTES = 256 * 1024
"""Bytes written between two pacing sleeps: small enough to keep the rate smooth."""


@dataclass(frozen=True)
class Shaping:
    """How a stand-in remote delays and paces what it serves."""

    latency_s: float = 0.0
    """Added to every request before it is answered (seconds)."""
    bandwidth_bps: float | None = None
    """Bytes per second of one response body; None = as fast as loopback goes."""

    async def delay(self) -> None:
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    async def send(self, resp: web.StreamResponse, chunks: AsyncIterator[bytes]) -> None:
        """Write `chunks` to `resp`, never faster than the bandwidth allows: each part waits for
        its own transfer time before it is sent, so the last byte arrives no sooner than
        size / bandwidth after the first."""
        async for chunk in chunks:
            for off in range(0, len(chunk), CHUNK_BYTES):
                part = chunk[off : off + CHUNK_BYTES]
                if self.bandwidth_bps:
                    await asyncio.sleep(len(part) / self.bandwidth_bps)
                await resp.write(part)


async def one_chunk(data: bytes) -> AsyncIterator[bytes]:
    """A whole body as the async iterator `Shaping.send` takes."""
    yield data


class LoopbackServer(ABC):
    """An aiohttp application served on 127.0.0.1 from a thread of its own.

    Subclasses add their routes in `routes`. Start it with `start()` or a `with` block; `url`
    is valid once it has started (the port is chosen by the kernel)."""

    thread_name = "sluice-loopback"

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @abstractmethod
    def routes(self, app: web.Application) -> None:
        """Add this server's handlers to `app` (called once, on start)."""

    async def on_cleanup(self) -> None:
        """Release what the subclass opened on the loop (client sessions); nothing by default."""
        return None

    def start(self) -> LoopbackServer:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application(client_max_size=1024**3)
            self.routes(app)
            self._runner = web.AppRunner(app, access_log=None)
            try:
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, self.host, 0, backlog=1024)
                loop.run_until_complete(site.start())
                server = site._server
                assert server is not None
                self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
            except BaseException as err:
                errors.append(err)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.run_until_complete(self.on_cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None
        self._thread = None
