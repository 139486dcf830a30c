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


class DataServer:
    def __init__(
        self,
        root: str | os.PathLike[str],
        latency_s: float = 0.0,
        bandwidth_bps: float | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.root = Path(root).resolve()
        self.latency_s = latency_s
        self.bandwidth_bps = bandwidth_bps
        self.host = host
        self.port = 0
        self.requests: Counter[str] = Counter()
        self._faults: dict[str, list[int]] = {}
        self._mu = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
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
            chunk = 256 * 1024
            for off in range(0, len(data), chunk):
                part = data[off : off + chunk]
                await resp.write(part)
                if self.bandwidth_bps:
                    await asyncio.sleep(len(part) / self.bandwidth_bps)
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away (a cancelled prefetch); nothing to report
        return resp

    def start(self) -> DataServer:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self._handle)
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
            loop.close()

        self._thread = threading.Thread(target=run, name="sluice-dataserver", daemon=True)
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

    def __enter__(self) -> DataServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
