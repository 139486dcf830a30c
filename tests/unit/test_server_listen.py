"""An API address that cannot be bound is said with the address and the settings that name it:
`sluice up` said `error: [Errno 98] Address already in use` or `cannot serve: [Errno -2] Name or
service not known` (ops walk s31)."""

from __future__ import annotations

import socket

import pytest

from sluice import server


def test_a_taken_port_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(
            server.CannotListen, match=rf"^cannot listen on 127.0.0.1:{port} \(SLUICE_HOST, SLUICE_PORT"
        ):
            server._bind("127.0.0.1", port)


def test_a_host_that_is_no_address_is_named() -> None:
    with pytest.raises(server.CannotListen, match=r"^cannot listen on 999.1.1.1:0 \(SLUICE_HOST, SLUICE_PORT"):
        server._bind("999.1.1.1", 0)
    assert server.CannotListen in server.START_ERRORS
