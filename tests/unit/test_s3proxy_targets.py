"""The shaping proxy in front of the S3 stand-in (data/s3proxy.py) forwards paths only: a
request whose target is not a path (absolute-form `GET http://host/x`) is a 400, never a 500
or a request to any host but its upstream."""

from __future__ import annotations

import http.server
import socket
import threading

from sluice.data.s3proxy import ShapingProxy


def raw_get(host: str, port: int, target: str) -> bytes:
    with socket.create_connection((host, port), timeout=10) as c:
        c.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return data


def test_only_path_targets_are_forwarded() -> None:
    seen: list[str] = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    try:
        with ShapingProxy(f"http://127.0.0.1:{up.server_port}") as proxy:
            ok = raw_get(proxy.host, proxy.port, "/bucket/key")
            assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"ok")
            other = raw_get(proxy.host, proxy.port, f"http://127.0.0.1:{up.server_port}/secret")
            assert other.startswith(b"HTTP/1.1 400"), other[:200]
        assert seen == ["/bucket/key"]
    finally:
        up.shutdown()
        up.server_close()
