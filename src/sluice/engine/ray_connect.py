"""Which Ray cluster the Ray engine joins, said out loud, and a bounded check that it answers.

`ray.init(address=None)` would join whatever Ray finds (RAY_ADDRESS, or the newest `ray start`
cluster on this machine through /tmp/ray/ray_current_cluster) while the plane believed it had
started a private instance; and an address nobody answers at made `ray.init` retry forever.
So the engine resolves the address itself (an explicit `ray_address` first, then RAY_ADDRESS,
said as such; none: a fresh instance, `address="local"`), and before joining checks within a
few seconds that the address answers as a Ray cluster does: Ray's GCS and its Client server
speak gRPC, so after HTTP/2's client preface they send a SETTINGS frame. A port that accepts
connections but is something else (sluice's own API, a web server) made `ray.init` retry for
minutes.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping

from sluice.settings import check_ray_address

CONNECT_TIMEOUT_S = 5.0
"""How long the engine waits for a Ray address to accept a TCP connection before giving up."""


class RayUnreachable(ConnectionError):
    """The Ray cluster named does not answer (or the address is not one); the message is one
    line naming the address."""


def resolve_address(address: str | None, environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(address to join or None for a fresh local instance, where it came from): "ray_address"
    for an explicit one, "RAY_ADDRESS" for the environment's, "" when none (or `local`)."""
    env = os.environ if environ is None else environ
    if address and address.strip() != "local":
        return address.strip(), "ray_address"
    if address is None and env.get("RAY_ADDRESS", "").strip() not in ("", "local"):
        return env["RAY_ADDRESS"].strip(), "RAY_ADDRESS"
    return None, ""


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""HTTP/2's client connection preface, then an empty SETTINGS frame (RFC 9113, 3.4)."""
H2_SETTINGS = 0x04
"""Frame type of SETTINGS: the first frame an HTTP/2 server sends."""


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """RayUnreachable unless `address` is a valid Ray address whose port answers HTTP/2's
    preface with a SETTINGS frame within `timeout_s` (gRPC: the GCS, or the Ray Client server
    for ray://)."""
    try:
        form, host, port = check_ray_address(address)
    except ValueError as err:
        raise RayUnreachable(f"not a Ray address: {err}") from None
    if form == "local" or port is None:
        return
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(H2_PREFACE)
            head = _read_up_to(conn, 9)
            if len(head) == 9 and head[3] != H2_SETTINGS:
                with contextlib.suppress(OSError):  # what is there already: enough to name the answer
                    head += conn.recv(64)
    except TimeoutError:
        raise RayUnreachable(f"cannot reach the Ray cluster at {where}: no answer within {timeout_s:g} s") from None
    except OSError as err:
        raise RayUnreachable(f"cannot reach the Ray cluster at {where}: {err.strerror or err}") from None
    if len(head) < 9 or head[3] != H2_SETTINGS:
        said = head.split(b"\r\n", 1)[0].decode("ascii", "replace").strip() or "nothing"
        raise RayUnreachable(
            f"{where} is not a Ray cluster: it accepts connections but does not speak gRPC (it answered {said[:60]!r})"
        )


def _read_up_to(conn: socket.socket, n: int) -> bytes:
    """Up to n bytes, fewer when the peer closes first."""
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
