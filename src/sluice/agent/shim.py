"""The per-attempt supervisor: `python -m sluice.agent.shim [options] -- argv...`.

Why a shim at all: the control plane must be able to die and come back without killing or
losing jobs. The agent starts this tiny process in a session of its own, so it outlives the
agent; it puts itself into the job's cgroups (its child inherits them), runs the job's argv
without a shell in its own process group, appends the output to the job's log, and — the one
thing only a parent can know — writes the exit code atomically into the attempt directory.
A later agent reads that file to report an exit that happened while nobody watched.

It ignores SIGTERM/SIGINT/SIGHUP through a no-op handler (not SIG_IGN, which the job would
inherit across exec), so a `killpg(SIGTERM)` reaches the job while the shim waits to record
how it ended. Stdlib only: it starts in milliseconds and cannot break on a missing package.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXIT_FILE = "exit_code"
CHILD_FILE = "child.json"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """tmp + fsync + rename: a reader sees the old file or the whole new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ignore(signum: int, frame: object) -> None:
    """Stay alive: the job decides how to react to SIGTERM, the shim only records the end."""


def _join(procs_files: list[str], cpus: str | None) -> list[str]:
    problems = []
    for f in procs_files:
        try:
            Path(f).write_text(str(os.getpid()))
        except OSError as err:
            problems.append(f"could not join {f}: {err.strerror}")
    if cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except (OSError, ValueError) as err:
            problems.append(f"could not pin to cpus {cpus}: {err}")
    return problems


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sluice-shim")
    p.add_argument("--attempt-dir", required=True, type=Path)
    p.add_argument("--log", required=True, type=Path)
    p.add_argument("--cwd", required=True)
    p.add_argument("--join", action="append", default=[], help="cgroup.procs file to write our pid to")
    p.add_argument("--cpus", default=None, help="comma-separated cores to pin to")
    p.add_argument("--header", default="", help="line written to the log before the job starts")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("no command given after --")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    attempt_dir: Path = ns.attempt_dir
    with open(ns.log, "ab", buffering=0) as log:
        if ns.header:
            log.write(ns.header.encode() + b"\n")
        for problem in _join(ns.join, ns.cpus):
            log.write(f"[sluice] warning: {problem}\n".encode())
        try:
            child = subprocess.Popen(
                ns.command, cwd=ns.cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True
            )
        except OSError as err:
            reason = f"could not start {ns.command[0]!r}: {err.strerror or err}"
            log.write(f"[sluice] {reason}\n".encode())
            write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": 127, "time": time.time(), "reason": reason})
            return 127
        write_json_atomic(attempt_dir / CHILD_FILE, {"pid": child.pid, "started": time.time()})
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
                continue
        reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        log.write(f"[sluice] attempt ended: {reason}\n".encode())
    write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": code, "time": time.time(), "reason": reason})
    return 0


if __name__ == "__main__":
    sys.exit(main())
