"""Client.wait and Client.follow_progress check their timing arguments before asking the server
(walk5): wait(timeout_s=nan) never timed out, and poll_s=0 asked the server in a tight loop
(a negative poll_s failed later inside time.sleep)."""

from __future__ import annotations

import math

import pytest

from sluice.client import Client


@pytest.fixture
def client() -> Client:
    # Nothing listens there: a call that reached the network would raise UnreachableError instead.
    return Client(url="http://127.0.0.1:9", token="slc_x")


@pytest.mark.parametrize("poll_s", [0, -1, math.nan, math.inf])
def test_a_bad_poll_is_refused_before_any_request(client: Client, poll_s: float) -> None:
    with pytest.raises(ValueError, match="poll_s"):
        client.wait("j-1", timeout_s=1, poll_s=poll_s)
    with pytest.raises(ValueError, match="poll_s"):
        next(client.follow_progress("j-1", poll_s=poll_s))


def test_a_nan_timeout_is_refused(client: Client) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        client.wait("j-1", timeout_s=math.nan)
