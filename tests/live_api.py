"""The control plane's real API served on a free loopback port, found by the CLI the way a
user's CLI finds it ($SLUICE_HOME/server.json and the token files). Shared by the tests that
drive `sluice ...` commands (CliRunner, in-process) against a live server."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from sluice.api.app import create_app
from sluice.cli.main import app as cli_app
from sluice.server import write_secret

_runner = CliRunner()


def run_cli(*args: str) -> tuple[int, str, str]:
    """`sluice ARGS...` in this process: (exit code, stdout, stderr); an exception other than
    the CLI's own exit is raised, so a crash fails the test instead of reading as exit 1."""
    r = _runner.invoke(cli_app, list(args))
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[http.server.ThreadingHTTPServer]:
    """A real HTTP server on loopback (a free port) answering with `handler`, for the block."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_for_cli(plane: Any, home: Path, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Serve `plane` until the block ends; yields its URL. The CLI's environment points at
    `home`, whose `token` is the default tenant's and `admin.token` the admin's."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(plane), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:  # readiness, not a timing assertion
        if not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port}"
    (home / "server.json").write_text(json.dumps({"pid": 0, "url": url}))
    write_secret(home / "token", tokens["default"])
    write_secret(home / "admin.token", tokens["admin"])
    for var in ("SLUICE_URL", "SLUICE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "250")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
