"""Running `ip` and programs inside namespaces: argv lists, never a shell.

Every privileged step of the lab goes through here, so the privilege check, the binary's
location and error reporting live in one place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
NETNS_DIR = Path("/run/netns")


class NetLabError(RuntimeError):
    """The lab cannot do what was asked; the message says why (missing privilege, tool, kernel part)."""


def tool(name: str) -> str | None:
    """A system tool on PATH or in the sbin folders (often off a non-root PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        cand = os.path.join(folder, name)
        if os.access(cand, os.X_OK):
            return cand
    return None


def ip_binary() -> str:
    found = tool("ip")
    if found is None:
        raise NetLabError("the `ip` command (iproute2) is not installed; install iproute2")
    return found


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def privilege_problem() -> str | None:
    """Why this process cannot build the lab, or None. Namespaces need CAP_SYS_ADMIN (mount
    of /run/netns) and links need CAP_NET_ADMIN; root normally has both."""
    try:
        ip_binary()
    except NetLabError as err:
        return str(err)
    caps = _effective_caps()
    missing = [
        n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)) if not caps >> bit & 1
    ]
    if missing:
        return (
            f"the network lab creates network namespaces and links, which needs {' and '.join(missing)} "
            f"(run as root); this process runs as uid {os.geteuid()}"
        )
    return None


def require_privileges() -> None:
    problem = privilege_problem()
    if problem:
        raise NetLabError(problem)


def run_ip(*args: str, netns: str | None = None, check: bool = True, timeout: float = 20.0) -> str:
    """`ip [-n NS] ARGS...`; raises NetLabError with ip's own message on failure."""
    argv = [ip_binary(), *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NetLabError(f"{' '.join(argv[1:])}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def in_netns(netns: str | None, argv: Sequence[str]) -> list[str]:
    """argv that runs `argv` inside `netns` (None: here, in the host's namespace)."""
    if netns is None:
        return list(argv)
    return [ip_binary(), "netns", "exec", netns, *argv]


def sysctl(netns: str, key: str, value: str) -> None:
    """Set a per-namespace sysctl by writing /proc/sys inside the namespace (no sysctl binary needed)."""
    path = "/proc/sys/" + key.replace(".", "/")
    write = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
    argv = in_netns(netns, [sys.executable, "-c", write, path, value])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        raise NetLabError(f"sysctl {key}={value} in {netns}: {proc.stderr.strip()}")


def list_netns() -> list[str]:
    out = run_ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]
