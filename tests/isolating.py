"""Whether this test process may run jobs as tenant uids (root, or the capabilities
docs/security.md lists): the tests of isolation need it and skip, saying so, without it."""

from __future__ import annotations

import pytest

from sluice.agent.isolation import IsolationUnavailable, detect_isolation


def may_switch_users() -> bool:
    try:
        return detect_isolation("auto").enabled
    except IsolationUnavailable:
        return False


needs_root = pytest.mark.skipif(not may_switch_users(), reason="needs a process that may switch users (root)")
