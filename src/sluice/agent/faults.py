"""Fault injection: make one (virtual) node sick for real, to test the health loop end to end.

Kinds: `cpu` (busy loops on every core of the node), `memory` (allocate and keep touching
MB of RAM), `io` (write + fsync storm into a folder), `net` (a TCP flood over loopback to a
sink the fault runs itself: egress counted in the node's net_cls group). Every fault process is pinned to the
node's cores (its cpuset), runs in its own process group and is killed with it, so a fault
on node-1 stresses node-1's cores and not the test runner's. Injected through the node's
agent (`FaultBoard`), its processes are also started inside the node's own cgroups
(sluice.agent.node_cgroup), so the fault shows in that node's cgroup KPIs and only there.

stress-ng (Debian) is used where installed — it is the tool operators know; otherwise the
same loads are made by small Python children. Nothing goes through a shell.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import TracebackType

_ENTER = Path(__file__).with_name("enter.py")
"""The launcher that starts a fault's processes inside the node's cgroups (sluice.agent.enter)."""
_PY_CPU = "while True: pass"
_PY_MEM = (
    "import sys, time\n"
    "mb = int(sys.argv[1]); buf = bytearray(mb * 1024 * 1024)\n"
    "while True:\n"
    "    for i in range(0, len(buf), 4096): buf[i] = (buf[i] + 1) % 256\n"
    "    time.sleep(0.05)\n"
)
_PY_IO = (
    "import os, sys\n"
    "path = os.path.join(sys.argv[1], f'io-{os.getpid()}'); block = os.urandom(1 << 20)\n"
    "while True:\n"
    "    with open(path, 'wb') as f:\n"
    "        for _ in range(32): f.write(block)\n"
    "        f.flush(); os.fsync(f.fileno())\n"
)
_PY_NET = (
    "import socket, threading\n"
    "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n"
    "def sink():\n"
    "    conn, _ = srv.accept()\n"
    "    while conn.recv(1 << 20): pass\n"
    "threading.Thread(target=sink, daemon=True).start()\n"
    "out = socket.create_connection(srv.getsockname()); block = b'x' * (1 << 16)\n"
    "while True: out.sendall(block)\n"
)
"""A TCP flood to a loopback sink the fault itself runs: the node's egress, not a NIC's."""


class FaultKind(StrEnum):
    CPU = "cpu"
    MEMORY = "memory"
    IO = "io"
    NET = "net"


@dataclass
class Fault:
    """A running fault. Use as a context manager, or call start()/stop().

    cores:  the node's CPU ids (the fault's processes are pinned there).
    memory_mb: RAM held by a memory fault. workers: CPU/IO worker processes (default one
    per core; more than that also starves the node's jobs of run-queue time).
    workdir: where an I/O fault writes (a temp dir by default, removed on stop). use_stress_ng: None = when installed.
    join: cgroup.procs files the fault's processes are started in (the node's own groups,
    `NodeGroups.fault_join`), so the fault shows in that node's cgroup counters and only
    there; empty: pinned to the cores only.
    """

    kind: FaultKind
    cores: Sequence[int]
    memory_mb: int = 512
    workers: int | None = None
    workdir: str | None = None
    use_stress_ng: bool | None = None
    join: Sequence[str] = ()
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _tmp: str | None = None

    def argvs(self) -> list[list[str]]:
        """The commands this fault runs (argv lists)."""
        cores = sorted(self.cores)
        n = self.workers or len(cores)
        stress = shutil.which("stress-ng") if self.use_stress_ng is not False else None
        if self.use_stress_ng and stress is None:
            raise RuntimeError("stress-ng was asked for but is not installed (apt-get install stress-ng)")
        where = self.workdir or self._tmp or tempfile.gettempdir()
        if self.kind == FaultKind.NET:  # stress-ng's socket stressor is mostly CPU; keep it plain
            return [[sys.executable, "-c", _PY_NET] for _ in range(max(n, 1))]
        if stress:
            taskset = ["--taskset", ",".join(map(str, cores))]
            if self.kind == FaultKind.CPU:
                return [[stress, "--cpu", str(n), "--cpu-load", "100", *taskset, "--quiet"]]
            if self.kind == FaultKind.MEMORY:
                return [[stress, "--vm", "1", "--vm-bytes", f"{self.memory_mb}M", "--vm-keep", *taskset, "--quiet"]]
            return [[stress, "--hdd", str(max(n, 1)), "--hdd-bytes", "64M", "--temp-path", where, *taskset, "--quiet"]]
        if self.kind == FaultKind.CPU:
            return [[sys.executable, "-c", _PY_CPU] for _ in range(n)]
        if self.kind == FaultKind.MEMORY:
            return [[sys.executable, "-c", _PY_MEM, str(self.memory_mb)]]
        return [[sys.executable, "-c", _PY_IO, where] for _ in range(max(n, 1))]

    def start(self) -> Fault:
        if self.procs:
            return self
        if self.kind == FaultKind.IO and self.workdir is None:
            self._tmp = tempfile.mkdtemp(prefix="sluice-fault-io-")
        cores = set(self.cores)
        for argv in self.argvs():
            if self.join:
                # By path, not `-m`: the launcher must not depend on how sluice is installed.
                argv = [sys.executable, str(_ENTER), *self.join, "--", *argv]
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            # Pin at once (stress-ng pins its workers itself with --taskset; the parent too).
            with contextlib.suppress(OSError):
                os.sched_setaffinity(p.pid, cores)
            self.procs.append(p)
        return self

    def stop(self) -> None:
        """Kill every fault process group and reap it; idempotent."""
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.procs.clear()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def __enter__(self) -> Fault:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def inject(kind: str, cores: Sequence[int], **kwargs: object) -> Fault:
    """Start a fault by name ('cpu', 'memory', 'io', 'net'); raises ValueError naming the bad kind."""
    try:
        k = FaultKind(kind)
    except ValueError:
        raise ValueError(f"fault kind {kind!r} is not one of {', '.join(f.value for f in FaultKind)}") from None
    return Fault(k, cores, **kwargs).start()  # type: ignore[arg-type]


@dataclass(frozen=True)
class FaultReport:
    """What `sluice node fault` started: on which node and cores, for how long, which processes."""

    node: str
    kind: str
    seconds: float
    cores: list[int]
    pids: list[int]
    command: str


class FaultBoard:
    """The faults an agent runs on its node (`sluice node fault`), each stopped by a timer
    after its duration, all stopped by `stop_all` or when the agent closes: an operator's
    fault must never outlive what they asked for."""

    MAX_SECONDS = 3600.0

    def __init__(self, node: str, cores: Sequence[int], join: Sequence[str] = ()) -> None:
        self.node = node
        self.cores = sorted(cores)
        self.join = tuple(join)
        """cgroup.procs files every fault joins: the node's own groups (see `Fault.join`)."""
        self._lock = threading.Lock()
        self._running: list[tuple[Fault, threading.Timer]] = []

    def inject(self, kind: str, seconds: float, workers: int | None = None, memory_mb: int = 512) -> FaultReport:
        if not 0 < seconds <= self.MAX_SECONDS:
            raise ValueError(f"seconds must be in (0, {self.MAX_SECONDS:g}], got {seconds:g}")
        fault = inject(kind, self.cores, workers=workers, memory_mb=memory_mb, join=self.join)
        timer = threading.Timer(seconds, self._expire, args=(fault,))
        timer.daemon = True
        with self._lock:
            self._running.append((fault, timer))
        timer.start()
        argv = fault.argvs()[0]
        return FaultReport(
            self.node, str(fault.kind), seconds, self.cores, [p.pid for p in fault.procs], shlex.join(argv)
        )

    def _expire(self, fault: Fault) -> None:
        fault.stop()
        with self._lock:
            self._running = [(f, t) for f, t in self._running if f is not fault]

    def stop_all(self) -> int:
        """Stop every fault now; returns how many were running."""
        with self._lock:
            running, self._running = self._running, []
        for fault, timer in running:
            timer.cancel()
            fault.stop()
        return len(running)
