"""The lab's lifetime: named namespaces and processes, torn down on exit and on signals.

Everything the lab creates is a network namespace named `sluice-<run id>-...`; every link and
address lives inside one of them, so deleting the namespaces removes all of it and the host's
own network is never touched. Processes started in a namespace are tracked and ended first
(a namespace with a live process outlives its name). SIGTERM and SIGHUP are turned into
SystemExit while the lab is open, so `finally` blocks run; SIGINT already raises
KeyboardInterrupt. `clean()` removes what a SIGKILLed run left behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from types import FrameType, TracebackType
from typing import IO, Any

from sluice.net.ipcmd import in_netns, list_netns, require_privileges, run_ip, sysctl

PREFIX = "sluice-"


def _to_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class Lab:
    """One run's namespaces and processes. Use as a context manager."""

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id or secrets.token_hex(3)
        if not self.run_id.isalnum() or len(self.run_id) > 8:
            raise ValueError(f"run_id {self.run_id!r}: use up to 8 letters or digits")
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[Any]] = []
        self._saved: dict[int, Any] = {}

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.run_id}-"

    # ------------------------------------------------------------------ lifetime
    def __enter__(self) -> Lab:
        require_privileges()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._saved[sig] = signal.signal(sig, _to_exit)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.teardown()
        finally:
            for sig_no, handler in self._saved.items():
                signal.signal(sig_no, handler)
            self._saved.clear()

    def teardown(self) -> None:
        """End our processes, then delete our namespaces (and with them every link inside)."""
        # A second SIGTERM during teardown must not cut it short.
        blocked = threading.current_thread() is threading.main_thread()
        old: dict[int, Any] = {}
        if blocked:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                old[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            for p in self.procs:
                stop_process(p)
            self.procs.clear()
            for ns in reversed(self.namespaces):
                delete_netns(ns)
            self.namespaces.clear()
            for ns in list_netns():  # anything of this run created outside add_netns
                if ns.startswith(self.prefix):
                    delete_netns(ns)
        finally:
            for sig_no, handler in old.items():
                signal.signal(sig_no, handler)

    def teardown_from(self, index: int) -> None:
        """Delete the namespaces made after the first `index` (one datapath's), ending our processes first."""
        for p in self.procs:
            stop_process(p)
        self.procs.clear()
        while len(self.namespaces) > index:
            delete_netns(self.namespaces.pop())

    def leftovers(self) -> list[str]:
        return [ns for ns in list_netns() if ns.startswith(self.prefix)]

    # ------------------------------------------------------------------ parts
    def add_netns(self, tag: str) -> str:
        name = self.prefix + tag
        run_ip("netns", "add", name)
        self.namespaces.append(name)
        run_ip("link", "set", "lo", "up", netns=name)
        return name

    def forwarding(self, netns: str) -> None:
        sysctl(netns, "net.ipv4.ip_forward", "1")

    def spawn(
        self,
        netns: str | None,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stdout: IO[Any] | int | None = subprocess.DEVNULL,
        stderr: IO[Any] | int | None = subprocess.DEVNULL,
        cwd: str | None = None,
    ) -> subprocess.Popen[Any]:
        """Start argv inside netns (None: the host namespace), tracked for teardown."""
        p = subprocess.Popen(
            in_netns(netns, argv),
            env=env,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            start_new_session=True,  # its own group: a Ctrl-C reaches the lab, which ends it
        )
        self.procs.append(p)
        return p

    def reap(self, p: subprocess.Popen[Any]) -> None:
        """Stop tracking a process that has ended (or end it now)."""
        stop_process(p)
        with contextlib.suppress(ValueError):
            self.procs.remove(p)


def stop_process(p: subprocess.Popen[Any], grace_s: float = 3.0) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(grace_s)


def delete_netns(name: str) -> None:
    """Kill what still runs inside (only namespaces of ours reach here), then delete it."""
    pids = run_ip("netns", "pids", name, check=False).split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)
    for _ in range(50):
        if not run_ip("netns", "pids", name, check=False).split():
            break
        time.sleep(0.05)
    run_ip("netns", "del", name, check=False)


def clean(run_id: str | None = None) -> list[str]:
    """Delete the namespaces a killed run left (all sluice- ones, or one run's); returns their names."""
    require_privileges()
    prefix = f"{PREFIX}{run_id}-" if run_id else PREFIX
    gone = [ns for ns in list_netns() if ns.startswith(prefix)]
    for ns in gone:
        delete_netns(ns)
    return gone
