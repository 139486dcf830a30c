"""A shaping proxy: puts per-request latency and a bandwidth limit in front of any HTTP
server — used in front of an S3-compatible server (moto in server mode) on loopback.

Why a proxy: S3 servers that run here (moto) answer at loopback speed, and these machines
have no netem to slow them down. The proxy forwards every request unchanged — method, path,
query, body and headers, Host included, so a SigV4 signature made for the proxy's address
still verifies — waits `latency_s` before forwarding and paces the response body at
`bandwidth_bps`, with the same `Shaping` as sluice's own file server. Clients point their
endpoint (`storage_options: {endpoint_url: proxy.url}`) at it instead of the server.
"""

from __future__ import annotations

import threading
from collections import Counter

import aiohttp
from aiohttp import web
from yarl import URL

from sluice.data.loopback import CHUNK_BYTES, LoopbackServer, Shaping

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that describe one connection, not the message: never forwarded."""


class ShapingProxy(LoopbackServer):
    """Forwards everything to `upstream` (``http://host:port``) with latency and pacing added.

    `requests` counts forwarded requests by method, `paths` GETs by path: what a test asserts
    on (each delayed request is one the upstream answered)."""

    thread_name = "sluice-shaping-proxy"

    def __init__(
        self,
        upstream: str,
        latency_s: float = 0.0,
        bandwidth_bps: float | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(host)
        self.upstream = upstream.rstrip("/")
        self.shaping = Shaping(latency_s, bandwidth_bps)
        self.requests: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        self._mu = threading.Lock()
        self._session: aiohttp.ClientSession | None = None

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._forward)

    async def on_cleanup(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._session

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        with self._mu:
            self.requests[request.method] += 1
            if request.method == "GET":
                self.paths[request.path] += 1
        if not request.raw_path.startswith("/"):
            # An absolute-form target (`GET http://host/x`) glued to the upstream's address made
            # a URL with no valid port: a 500 and a traceback per request. Only paths forward.
            return web.Response(status=400, text="the proxy forwards only requests for a path starting with '/'\n")
        await self.shaping.delay()
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        # raw_path keeps the client's percent-encoding: the signature covers it byte for byte.
        target = URL(self.upstream + request.raw_path, encoded=True)
        async with self._client().request(
            request.method,
            target,
            headers=headers,
            data=body or None,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        ) as up:
            out = {k: v for k, v in up.headers.items() if k.lower() not in HOP_BY_HOP}
            resp = web.StreamResponse(status=up.status, headers=out)
            await resp.prepare(request)
            if request.method != "HEAD":
                try:
                    await self.shaping.send(resp, up.content.iter_chunked(CHUNK_BYTES))
                    await resp.write_eof()
                except ConnectionError:
                    pass  # the client went away mid-body; nothing to report
            return resp

    def start(self) -> ShapingProxy:
        super().start()
        return self

    def __enter__(self) -> ShapingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
