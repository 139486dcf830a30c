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

Two rules keep a job from outliving the node it was placed on (issue 6: a job of a lost Ray
node must not run beside its requeued attempt):
- **The job dies with its shim** (`PR_SET_PDEATHSIG`): whatever kills the shim — Ray's
  worker killing its child processes as it exits, an operator — takes the job with it, so
  no job is ever orphaned and unsupervised.
- **`--guard PID:START`**: the shim watches a process whose life is the node's (on Ray, the
  raylet). When it is gone, the shim records "node lost" and SIGKILLs its process group (the
  job, the job's children and itself). START is the guard's start time in clock ticks since
  boot (`/proc/PID/stat`), so a reused pid is never mistaken for the guard.

Tenant isolation (`--uid/--gid`, docs/security.md): the shim stays the agent's user (it
writes the plane's files and joins cgroups), and only the job drops to the tenant's uid/gid
with no supplementary groups, between fork and exec. There, after the switch (a credential
change clears the parent-death signal, so that comes after it), the job also gets
`PR_SET_NO_NEW_PRIVS` (no set-uid binary or file capability gives it back any privilege),
its rlimits (`--rlimit`) and umask 077, and with `--unix-fence` a Landlock domain of its own
(agent/landlock.py: it reaches only the abstract Unix sockets it made, and ptraces nothing
outside it); where that fails, the job does not start.

The GPU fence (`--fence`, agent/gpu_fence.py): a device cgroup the shim must enter before the
job starts. Where it cannot, the job does not start: its CUDA_VISIBLE_DEVICES counts only the
GPUs inside the fence, and outside it those numbers name other GPUs.

Gangs (`--prefix "[rank1] "`): every replica of a job appends to the job's one log, so
`sluice job logs` shows all ranks, a crashing rank's traceback included. Then the job's
output goes through a pipe and the shim writes it a whole line at a time (O_APPEND: lines of
different ranks interleave, never mix), each line starting with the prefix.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sluice.agent import landlock

EXIT_FILE = "exit_code"
CHILD_FILE = "child.json"
ENV_FILE = "job-env.json"
"""The job's environment, written by the agent into the attempt folder (the plane's, 0600) and
removed by the shim once read: the shim itself runs as the plane's user in an environment of
the plane's (`shim_env`), never the job's, whose PYTHONPATH, LD_PRELOAD, ... the tenant chose."""
SHIM_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
GUARD_POLL_S = 0.2
"""How often the shim checks that its guard process is still there (seconds)."""
LONGEST_LINE = 64 * 1024
"""With --prefix, a line longer than this (or a progress bar that never ends one) is written
out in pieces, each prefixed, rather than held back."""
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
RLIMITS = {
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
}
"""The rlimits `--rlimit NAME=VALUE` may set on the job (soft = hard = VALUE)."""


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or
    None when it does not exist: with the pid, this names one process for its whole life."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def parse_guard(text: str) -> tuple[int, int]:
    pid, _, start = text.partition(":")
    return int(pid), int(start)


def _die_with_parent(libc: ctypes.CDLL, parent: int) -> None:
    """In the job, between fork and exec: SIGKILL this process when the shim dies."""
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the shim died before the line above took effect
        os._exit(137)


def _confine(libc: ctypes.CDLL, limits: dict[str, int], no_new_privs: bool, unix_fence: bool = False) -> None:
    """In the job, between fork and exec (after the user switch): rlimits, then no_new_privs,
    then the Landlock domain of the Unix-socket fence (which needs no_new_privs).
    A limit above the current hard one is clamped to it (an unprivileged job cannot raise it)."""
    for name, value in limits.items():
        which = RLIMITS[name]
        _, hard = resource.getrlimit(which)
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (cap, cap))
    if no_new_privs and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os._exit(126)
    if unix_fence:
        err = landlock.restrict_self(libc)
        if err:  # the job was to be fenced: never run it unfenced
            reason = f"[sluice] could not enter the job's Unix-socket fence (Landlock): {os.strerror(err)}\n"
            os.write(2, reason.encode())
            os._exit(126)


def parse_rlimit(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    if name not in RLIMITS:
        raise argparse.ArgumentTypeError(f"unknown rlimit {name!r}; one of {', '.join(RLIMITS)}")
    return name, int(value)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """tmp + fsync + rename: a reader sees the old file or the whole new one, never half.
    The file is the plane's: 0600, and never a symlink planted in its place."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(tmp, flags, 0o600), "w") as f:
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


def shim_env() -> dict[str, str]:
    """The environment the agent starts the shim in: the plane's own (a few variables of it),
    with sluice importable by an absolute path, and no current folder on sys.path. The shim runs
    as the plane's user (root under isolation) outside every fence, so nothing the tenant chose
    may reach its interpreter: a spec's PYTHONPATH, or a workdir holding `sluice/` or
    `argparse.py` (a `python -m` puts the current folder first on sys.path), or LD_PRELOAD, ran
    the tenant's code as root (red team s22). The job's own environment goes by `--env-file`."""
    env = {k: v for k, v in os.environ.items() if k in SHIM_ENV_KEEP}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONSAFEPATH"] = "1"
    return env


def read_job_env(path: Path) -> dict[str, str]:
    """The job's environment from the agent's file (never a symlink), which is then removed."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)) as f:
        data = json.load(f)
    with contextlib.suppress(OSError):
        path.unlink()
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError(f"{path}: not an environment")
    return data


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sluice-shim")
    p.add_argument("--attempt-dir", required=True, type=Path)
    p.add_argument("--log", required=True, type=Path)
    p.add_argument("--cwd", required=True)
    p.add_argument("--join", action="append", default=[], help="cgroup.procs file to write our pid to")
    p.add_argument(
        "--fence", action="append", default=[], help="cgroup.procs file of the job's device fence: joined, or no job"
    )
    p.add_argument(
        "--unix-fence", action="store_true", help="a Landlock domain scoped to the job's own abstract Unix sockets"
    )
    p.add_argument("--env-file", default=None, type=Path, help="the job's environment (JSON; removed once read)")
    p.add_argument("--cpus", default=None, help="comma-separated cores to pin to")
    p.add_argument("--header", default="", help="line written to the log before the job starts")
    p.add_argument("--prefix", default="", help="put this before every line of the job's output (a gang's rank)")
    p.add_argument("--guard", default=None, type=parse_guard, help="PID:START of the process the node lives by")
    p.add_argument("--uid", default=None, type=int, help="run the job as this uid (tenant isolation)")
    p.add_argument("--gid", default=None, type=int, help="... and this gid, with no supplementary groups")
    p.add_argument("--rlimit", action="append", default=[], type=parse_rlimit, help="NAME=VALUE, e.g. nofile=1024")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    if ns.command and ns.command[0] == "--":
        ns.command = ns.command[1:]
    if not ns.command:
        p.error("no command given after --")
    if (ns.uid is None) != (ns.gid is None):
        p.error("--uid and --gid go together")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    attempt_dir: Path = ns.attempt_dir
    log_fd = os.open(ns.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    tag = ns.prefix.encode()
    with open(log_fd, "ab", buffering=0) as log:
        if ns.header:
            log.write(tag + ns.header.encode() + b"\n")
        # The fences last: a later write to a parent's cgroup.procs in the same hierarchy (the
        # node's unified group) would move the job out of its fenced v2 group again.
        for problem in _join(ns.join, ns.cpus):
            log.write(tag + f"[sluice] warning: {problem}\n".encode())
        fence_problems = _join(ns.fence, None)
        if fence_problems:
            # The job was told its GPUs by their numbers inside the fence: outside it, those
            # numbers are other GPUs (maybe another tenant's). Never run it there. Nor outside
            # the v2 group its network fence matches (unmarked, its sockets open to all).
            reason = f"could not enter the job's GPU fence or network fence: {'; '.join(fence_problems)}"
            log.write(tag + f"[sluice] {reason}\n".encode())
            write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": 127, "time": time.time(), "reason": reason})
            return 127
        if ns.guard is not None and process_start_ticks(ns.guard[0]) != ns.guard[1]:
            _node_lost(attempt_dir, log, ns.guard[0], started=False)
        me, libc = os.getpid(), ctypes.CDLL(None, use_errno=True)
        limits, isolated = dict(ns.rlimit), ns.uid is not None

        def in_child() -> None:  # the shim has one thread: running Python between fork and exec is safe
            _die_with_parent(libc, me)
            _confine(libc, limits, no_new_privs=isolated, unix_fence=ns.unix_fence)

        user: dict[str, Any] = {"user": ns.uid, "group": ns.gid, "extra_groups": [], "umask": 0o077} if isolated else {}
        try:
            env = read_job_env(ns.env_file) if ns.env_file is not None else None
        except (OSError, ValueError) as err:
            reason = f"could not read the job's environment: {err}"
            log.write(tag + f"[sluice] {reason}\n".encode())
            write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": 127, "time": time.time(), "reason": reason})
            return 127
        try:
            child = subprocess.Popen(
                ns.command,
                cwd=ns.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if tag else log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                preexec_fn=in_child,
                env=env,
                **user,
            )
        except (OSError, subprocess.SubprocessError) as err:
            who = f" as uid {ns.uid}" if isolated else ""
            reason = f"could not start {ns.command[0]!r}{who}: {getattr(err, 'strerror', None) or err}"
            log.write(tag + f"[sluice] {reason}\n".encode())
            write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": 127, "time": time.time(), "reason": reason})
            return 127
        write_json_atomic(attempt_dir / CHILD_FILE, {"pid": child.pid, "started": time.time()})
        if tag:
            _copy_prefixed(child, tag, ns.guard, attempt_dir, log)
        code = _wait(child, ns.guard, attempt_dir, log)
        reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        log.write(tag + f"[sluice] attempt ended: {reason}\n".encode())
    write_json_atomic(attempt_dir / EXIT_FILE, {"exit_code": code, "time": time.time(), "reason": reason})
    return 0


def _wait(child: subprocess.Popen[bytes], guard: tuple[int, int] | None, attempt_dir: Path, log: Any) -> int:
    """The job's exit code; with a guard, checked every GUARD_POLL_S until the job ends."""
    if guard is None:
        return child.wait()
    while True:
        try:
            return child.wait(timeout=GUARD_POLL_S)
        except subprocess.TimeoutExpired:
            if process_start_ticks(guard[0]) != guard[1]:
                _node_lost(attempt_dir, log, guard[0], started=True)


def _copy_prefixed(
    child: subprocess.Popen[bytes], tag: bytes, guard: tuple[int, int] | None, attempt_dir: Path, log: Any
) -> None:
    """Copy the job's output from its pipe into the log, `tag` before every line, until the
    pipe closes or the job has exited (then what is buffered is drained, and output its
    leftover children write later is dropped: they are killed with the job's group). One
    thread, so the guard is checked every GUARD_POLL_S here too."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    rest = b""
    while True:
        ready, _, _ = select.select([fd], [], [], GUARD_POLL_S)
        ended = child.poll() is not None
        data, closed = _read_available(fd) if ready or ended else (b"", False)
        rest = _write_lines(log, tag, rest + data)
        if closed or ended:
            break
        if guard is not None and process_start_ticks(guard[0]) != guard[1]:
            _node_lost(attempt_dir, log, guard[0], started=True)
    if rest:
        log.write(tag + rest + b"\n")
    child.stdout.close()


def _read_available(fd: int) -> tuple[bytes, bool]:
    """What the pipe holds now (at most 4 MiB: a writer that never pauses does not hold the
    shim here), and whether it is closed (every writer gone)."""
    chunks: list[bytes] = []
    for _ in range(64):
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
    return b"".join(chunks), False


def _write_lines(log: Any, tag: bytes, data: bytes) -> bytes:
    """Write the whole lines of `data`, each after `tag`, in one write; returns the rest."""
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) > LONGEST_LINE:
        data += b"\n"
        cut = len(data)
    if cut:
        log.write(b"".join(tag + line for line in data[:cut].splitlines(keepends=True)))
    return data[cut:]


def _node_lost(attempt_dir: Path, log: Any, guard_pid: int, started: bool) -> None:
    """The node this job was placed on is gone: record it, then kill the whole group
    (the job, its children, this shim). Does not return."""
    reason = f"node lost: guard process {guard_pid} is gone" + ("; job killed" if started else "; job not started")
    log.write(f"[sluice] {reason}\n".encode())
    write_json_atomic(
        attempt_dir / EXIT_FILE,
        {"exit_code": -signal.SIGKILL, "time": time.time(), "reason": reason, "node_lost": True},
    )
    os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(137)  # not reached: the group's SIGKILL includes this process


if __name__ == "__main__":
    sys.exit(main())
