"""Which Ray cluster the Ray engine joins, said out loud, and a bounded check that it answers.

`ray.init(address=None)` would join whatever Ray finds (RAY_ADDRESS, or the newest `ray start`
cluster on this machine through /tmp/ray/ray_current_cluster) while the plane believed it had
started a private instance; and an address nobody answers at made `ray.init` retry forever.
So the engine resolves the address itself (an explicit `ray_address` first, then RAY_ADDRESS,
said as such; none: a fresh instance, `address="local"`), and before joining checks within a
few seconds that the address accepts a TCP connection.
"""

from __future__ import annotations

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


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """RayUnreachable unless `address` is a valid Ray address whose port accepts a TCP
    connection within `timeout_s` (the GCS, or the Ray Client server for ray://)."""
    try:
        form, host, port = check_ray_address(address)
    except ValueError as err:
        raise RayUnreachable(f"not a Ray address: {err}") from None
    if form == "local" or port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise RayUnreachable(
            f"cannot reach the Ray cluster at {host}:{port}: no answer within {timeout_s:g} s"
        ) from None
    except OSError as err:
        raise RayUnreachable(f"cannot reach the Ray cluster at {host}:{port}: {err.strerror or err}") from None
