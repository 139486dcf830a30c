"""What a connection may cost the server without a token (api/connections.py): a real uvicorn
server on loopback with the protocol the plane serves with, and raw sockets as the clients
that never finish a request (red-team pass 5: 20,000 of them held every descriptor)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from sluice.api.connections import AcceptErrorsOnce, protocol_with
from tests.live_api import free_port


@contextmanager
def server(header_timeout_s: float) -> Iterator[int]:
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/slow")
    async def slow() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:  # a followed log: a line every 0.2 s for 3 s
            for i in range(15):
                yield f"line {i}\n".encode()
                await asyncio.sleep(0.2)

        return StreamingResponse(lines(), media_type="text/plain")

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"got": len(await request.body())}

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", http=protocol_with(header_timeout_s), lifespan="off"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:  # readiness, not a timing assertion
        assert thread.is_alive()
        time.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


def closed_within(conn: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed the connection, or None if it still holds it."""
    conn.settimeout(seconds)
    got = b""
    try:
        while chunk := conn.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    return got


def test_a_connection_that_never_finishes_its_headers_is_closed() -> None:
    with server(header_timeout_s=1.0) as port:
        silent = socket.create_connection(("127.0.0.1", port))
        dripping = socket.create_connection(("127.0.0.1", port))
        dripping.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        with silent, dripping:
            assert closed_within(silent, 5) == b""
            assert closed_within(dripping, 5) == b""
        with socket.create_connection(("127.0.0.1", port)) as honest:  # a whole request is answered
            honest.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = closed_within(honest, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 200") and b'"ok"' in answer


def test_a_kept_alive_connection_has_the_same_deadline_for_its_next_request() -> None:
    with server(header_timeout_s=1.0) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.settimeout(5)
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        # Drip a second request a byte at a time, faster than uvicorn's own keep-alive timeout
        # (which any byte resets): the header deadline still ends it.
        start, dropped = time.monotonic(), False
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                dropped = True
                break
            time.sleep(0.05)
            if time.monotonic() - start > 4:
                break
        assert dropped or closed_within(conn, 3) is not None


def test_a_request_whose_body_never_comes_is_closed() -> None:
    """Headers on time, then not the body they announce (no token needed): it held its
    connection for good (red-team pass 6)."""
    with server(header_timeout_s=1.0) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        assert closed_within(conn, 5) is not None
        with socket.create_connection(("127.0.0.1", port)) as honest:  # a whole body is answered
            honest.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
            answer = closed_within(honest, 5)
            assert answer is not None and answer.startswith(b"HTTP/1.1 200") and b'"got":3' in answer


def test_a_pipelined_long_answer_is_not_cut_by_the_header_deadline() -> None:
    """A request pipelined behind another starts inside uvicorn's on_response_complete: the
    deadline armed there watched that request's cycle and closed its answer (a followed log)
    header_timeout_s into it (red-team pass 6)."""
    with server(header_timeout_s=1.0) as port, socket.create_connection(("127.0.0.1", port)) as conn:
        short = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        conn.sendall(short + b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = closed_within(conn, 10)
        assert answer is not None and b"line 14\n" in answer


def test_accept_failures_are_logged_once_a_minute_with_a_count() -> None:
    keep = AcceptErrorsOnce(every_s=60.0)

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    flood = [record("socket.accept() out of system resource\nsocket: <x>") for _ in range(1000)]
    passed = [r for r in flood if keep.filter(r)]
    assert len(passed) == 1
    assert keep.filter(record("Task exception was never retrieved"))  # anything else passes
    keep._last -= 61  # a minute later
    nxt = record("socket.accept() out of system resource")
    assert keep.filter(nxt) and "999 more since the last one logged" in str(nxt.msg)
