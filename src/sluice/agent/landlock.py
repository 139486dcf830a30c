"""The Unix-socket fence: a Landlock domain per attempt (setting `unix_fence`).

Why: abstract Unix sockets (`\\0name`) have no file and so no permissions; any process in the
same network namespace can connect to one, whatever its uid. Jobs share the host's namespace,
so without more a tenant's job could connect to one another tenant's job listens on (NCCL's
IPC socket, a job's own control socket). The network fence (agent/net_fence.py) does not see
Unix sockets. Landlock's scopes (ABI 6, Linux 6.12) close exactly this: a process in a
Landlock domain may connect only to abstract sockets made inside that domain (the job and its
children), and, like every Landlock domain, may not ptrace (nor read `/proc/<pid>/mem` or
`environ` of) a process outside it, its tenant's other processes included (the dataset cache
helper runs as the tenant's uid outside any job).

Stdlib only: the shim imports it and restricts the job between fork and exec.
"""

from __future__ import annotations

import ctypes
import os

_SYS_CREATE_RULESET = 444
_SYS_RESTRICT_SELF = 446
"""Landlock's syscall numbers, the same on every architecture (the generic table)."""
_CREATE_RULESET_VERSION = 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1
SCOPES_ABI = 6
"""The first Landlock ABI with scopes."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi_version(libc: ctypes.CDLL | None = None) -> int:
    """The kernel's Landlock ABI version; 0 where there is none (too old, or not enabled)."""
    lib = libc or _libc()
    version = lib.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def missing() -> str:
    """Why jobs cannot be fenced here, or "" where they can."""
    version = abi_version()
    if version >= SCOPES_ABI:
        return ""
    if version == 0:
        return "the kernel has no Landlock (Linux 6.12 or later with landlock in its lsm= list)"
    return f"the kernel's Landlock is ABI {version}; scopes need ABI {SCOPES_ABI} (Linux 6.12)"


def restrict_self(libc: ctypes.CDLL) -> int:
    """Put the calling process (and all it starts) in a new Landlock domain scoped to its
    abstract Unix sockets. Needs `PR_SET_NO_NEW_PRIVS` set first (or CAP_SYS_ADMIN).
    Returns 0, or the errno of the call that failed. Safe between fork and exec: no
    allocation beyond one small ctypes structure."""
    attr = _RulesetAttr(0, 0, SCOPE_ABSTRACT_UNIX_SOCKET)
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return ctypes.get_errno() or 1
    try:
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return ctypes.get_errno() or 1
    finally:
        os.close(fd)
    return 0
