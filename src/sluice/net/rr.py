"""Request/response latency: a TCP echo server and a client timing each round trip.

Run as `python -m sluice.net.rr serve|ping ...` inside a namespace. The client sends `count`
messages of `size` bytes one at a time (TCP_NODELAY), waits for each echo, and prints the
round-trip times as JSON. Both ends are bounded in message count and wall time, so a lost
peer ends the run instead of hanging it.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def serve(host: str, port: int, size: int, limit_s: float) -> int:
    with socket.create_server((host, port), reuse_port=False) as srv:
        srv.settimeout(limit_s)
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(limit_s)
            deadline = time.monotonic() + limit_s
            try:
                while time.monotonic() < deadline:
                    conn.sendall(_recv_exact(conn, size))
            except (ConnectionError, TimeoutError):
                pass
    return 0


def ping(host: str, port: int, size: int, count: int, warmup: int, limit_s: float, connect_s: float) -> int:
    deadline = time.monotonic() + connect_s
    while True:
        try:
            s = socket.create_connection((host, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    rtts: list[float] = []
    msg = b"x" * size
    with s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(limit_s)
        end = time.monotonic() + limit_s
        for i in range(warmup + count):
            if time.monotonic() > end:
                break
            t0 = time.perf_counter_ns()
            s.sendall(msg)
            _recv_exact(s, size)
            if i >= warmup:
                rtts.append((time.perf_counter_ns() - t0) / 1e3)
    json.dump({"rtt_us": rtts, "size": size}, sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sluice.net.rr")
    p.add_argument("mode", choices=("serve", "ping"))
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--limit-s", type=float, default=30.0)
    p.add_argument("--connect-s", type=float, default=10.0)
    a = p.parse_args(argv)
    if a.mode == "serve":
        return serve(a.host, a.port, a.size, a.limit_s)
    return ping(a.host, a.port, a.size, a.count, a.warmup, a.limit_s, a.connect_s)


if __name__ == "__main__":
    sys.exit(main())
