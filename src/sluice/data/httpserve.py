"""A small HTTP file server with injected per-request latency, bandwidth limit and faults.

Stands in for remote object storage in tests and `sluice bench data`: this machine has no
netem, so the delay is added in the server. Serves files under a root folder (directory
listings like nginx's autoindex, which fsspec's HTTP filesystem understands), counts requests
per path, and can cut a response mid-body to test what a client does with a dropped read.
"""

from __future__ import annotations

import asyncio
import html
import os
import threading
from collections import Counter
from pathlib import Path

from aiohttp import web

from sluice.data.errors import UnsafePath
from sluice.data.loopback import LoopbackServer, Shaping, one_chunk


class DataServer(LoopbackServer):
    thread_name = "sluice-dataserver"

    def __init__(
        self,
        root: str | os.PathLike[str],
        latency_s: float = 0.0,
        bandwidth_bps: float | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(host)
        self.root = Path(root).resolve()
        self.shaping = Shaping(latency_s, bandwidth_bps)
        self.requests: Counter[str] = Counter()
        self._faults: dict[str, list[int]] = {}
        self._mu = threading.Lock()

    def routes(self, app: web.Application) -> None:
        app.router.add_route("GET", "/{tail:.*}", self._handle)

    def cut_after(self, rel_path: str, after_bytes: int, times: int = 1) -> None:
        """The next `times` GETs of `rel_path` send `after_bytes` of the body, then drop the connection."""
        with self._mu:
            self._faults[rel_path.strip("/")] = [after_bytes, times]

    def _resolve(self, rel: str) -> Path:
        p = (self.root / rel).resolve()
        if p != self.root and self.root not in p.parents:
            raise UnsafePath(rel)
        return p

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rel = request.match_info.get("tail", "").strip("/")
        if request.method == "GET":
            with self._mu:
                self.requests[rel] += 1
        await self.shaping.delay()
        try:
            path = self._resolve(rel)
        except UnsafePath:
            raise web.HTTPForbidden() from None
        if path.is_dir():
            links = "".join(
                f'<a href="{html.escape(e.name + ("/" if e.is_dir() else ""))}">{html.escape(e.name)}</a>\n'
                for e in sorted(path.iterdir())
            )
            return web.Response(text=f"<html><body>\n{links}</body></html>", content_type="text/html")
        if not path.is_file():
            raise web.HTTPNotFound()
        data = await asyncio.to_thread(path.read_bytes)
        resp = web.StreamResponse(headers={"Content-Length": str(len(data))})
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        with self._mu:
            fault = self._faults.get(rel)
            if fault and fault[1] > 0:
                fault[1] -= 1
                cut: int | None = fault[0]
            else:
                cut = None
        try:
            if cut is not None:
                await resp.write(data[:cut])
                if request.transport is not None:
                    request.transport.close()
                return resp
            await self.shaping.send(resp, one_chunk(data))
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away (a cancelled prefetch); nothing to report
        return resp

    def start(self) -> DataServer:
        super().start()
        return self

    def __enter__(self) -> DataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
