"""The control-plane server process: reconcile loop + REST API, run by `sluice up`.

`serve(settings)` owns the process lifecycle: one server per $SLUICE_HOME (a live
`server.json` refuses a second), first-start tenants with their tokens written 0600 for the
local user's CLI (the database is 0600 too, $SLUICE_HOME 0700 or, with tenant isolation,
0711: see docs/security.md), and a graceful stop on SIGTERM/SIGINT that leaves job processes running —
the next start adopts them (see control/recovery.py).

It lives above both `api` and `control` because it joins them (the plane and the app that
serves it); keeping it out of `control` keeps every import arrow pointing down (pyproject's
import-linter contracts).

Run it as `python -m sluice.server`; configuration comes from SLUICE_* variables and
$SLUICE_HOME/settings.yaml (sluice.settings), never from a shell.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psutil

from sluice.agent.isolation import Isolation, IsolationUnavailable, detect_isolation, interpreter_problem
from sluice.agent.netif import NetInterfaceUnavailable
from sluice.agent.node_owners import NodeInUse
from sluice.agent.uid_ranges import UidRangeClaim, UidRangeInUse, claim_uid_range, store_of
from sluice.control.engine_record import EngineMismatch, EngineRecord, check_engine, write_record
from sluice.engine.ray_connect import RayUnreachable
from sluice.model import JobUser
from sluice.settings import Settings, load_settings
from sluice.store import StoreInUse, StoreNotOpened, open_store

log = logging.getLogger("sluice.server")

SERVER_FILE = "server.json"
ADMIN_TOKEN_FILE = "admin.token"
TOKEN_FILE = "token"
HOME_LOCK_FILE = "plane.lock"
"""Held (flock) by the one plane serving the home, for as long as its process lives."""
PLANE_TAG_FILE = "plane-tag"
"""The home's plane's database session tag, kept across restarts (see plane_tag)."""
_TAG = re.compile(r"^sluice-plane-[0-9a-f]{16}$")


class AlreadyRunning(RuntimeError):
    """Another server already serves this SLUICE_HOME."""


class CannotListen(RuntimeError):
    """The API's address cannot be bound: SLUICE_HOST names no address of this machine, or the
    port is taken. Said with the address and the settings, not a bare `[Errno 98] ...`."""


class HomeError(RuntimeError):
    """$SLUICE_HOME cannot hold the server's state; the message names the folder and why."""


def check_home(home: Path) -> None:
    """Refuse, before anything starts, a home the server could not keep its state in.

    A file where the folder should be, a read-only mount or an unwritable parent would
    otherwise surface as a traceback from whichever part touched the disk first (the store,
    the cache, server.json). Nothing is created here: `serve` does that once this passed.
    """
    if home.exists() and not home.is_dir():
        raise HomeError(f"SLUICE_HOME {home} is not a folder (a file is in the way)")
    existing = home
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the nearest folder that is there: where mkdir would write
    if not existing.is_dir():
        raise HomeError(f"SLUICE_HOME {home} cannot be created: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        problem = "is on a read-only file system" if read_only else "is not writable by this user"
        where = f"{home}" if existing == home else f"{home} cannot be created: its parent {existing}"
        raise HomeError(f"SLUICE_HOME {where} {problem}")


def make_home(home: Path) -> None:
    """`check_home`, then create the folder: what only the kernel can refuse (a folder under
    /proc or /sys, say, which no permission bit forbids) is a HomeError naming it too."""
    check_home(home)
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise HomeError(f"SLUICE_HOME {home} cannot be created: {err.strerror or err}") from None


def _open_in_home(path: Path, flags: int, what: str) -> int:
    """os.open of a file of the home, never through a symbolic link (one planted there would
    have the plane write or trust a file elsewhere), and only a regular file: HomeError naming
    the file and why otherwise."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        why = "is a symbolic link, which sluice does not follow" if err.errno == errno.ELOOP else err.strerror or err
        raise HomeError(f"{path} ({what}) cannot be opened: {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HomeError(f"{path} ({what}) is not a regular file")
    return fd


def lock_home(home: Path) -> int:
    """Hold the home for this process until it closes the returned descriptor or ends (`kill
    -9` and a host reboot included): an exclusive flock on `plane.lock`, the descriptor never
    passed to a child. AlreadyRunning if another live process holds it. server.json alone let
    two planes started at once on one home both pass (it is written only once a plane
    serves); and holding this lock is what proves the home's previous plane dead, so that
    its database session, if it lingers, may be ended (`plane_tag`)."""
    path = home / HOME_LOCK_FILE
    fd = _open_in_home(path, os.O_RDWR | os.O_CREAT, "the plane's lock of its home")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise AlreadyRunning(f"a sluice server (pid {holder}) is already running for {home}") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def plane_tag(home: Path) -> str:
    """This home's plane's database session tag (PostgreSQL's application_name of its claim
    session, store/sql.py), the same across restarts of the plane: a plane killed (`kill -9`,
    a crash, a host reboot) can leave its session, and the lock it holds, lingering at the
    server until TCP gives up, and only the tag lets the restarted plane tell that session
    for its predecessor's and end it. Call it only holding `lock_home`: that proves the
    predecessor dead; a live plane's session is never a predecessor's.

    The file (0600, `plane-tag`) names the machine and home it was made for: a copy of the
    home (another plane on the same database) gets a tag of its own, or the two planes would
    end each other's sessions. HomeError naming the file where it cannot be read or written."""
    path = home / PLANE_TAG_FILE
    owner = {"host": socket.gethostname(), "home": str(home.resolve())}
    try:
        fd = _open_in_home(path, os.O_RDONLY, "the plane's database session tag")
    except HomeError:
        if path.exists() or path.is_symlink():
            raise
    else:
        try:
            with os.fdopen(fd, "rb") as f:
                raw = f.read(4096)
            kept = json.loads(raw)
            tag = kept["tag"]
            if not isinstance(tag, str) or not _TAG.match(tag):
                raise ValueError(f"{tag!r} is not a plane tag")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise HomeError(
                f"{path} (the plane's database session tag) cannot be read: {err}; remove it and "
                "the plane makes a new one (a lingering session of the previous plane then holds "
                "the database until the server drops it)"
            ) from None
        if {k: kept.get(k) for k in owner} == owner:
            return tag
        log.info("%s was made for %s, not this home: this plane gets a tag of its own", path, kept)
    tag = f"sluice-plane-{uuid.uuid4().hex[:16]}"
    fresh = path.with_name(f".{PLANE_TAG_FILE}.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    fd = _open_in_home(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "the plane's database session tag")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"tag": tag, **owner}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(fresh, path)  # a rename replaces a link planted at path, never follows it
    return tag


class _Terminated(Exception):
    """Raised by the SIGTERM handler so the clean-up in `serve` runs."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    # uvicorn handles SIGTERM while it serves, then re-raises the signal after it has stopped;
    # with the default handler that would kill us before the plane is stopped and server.json
    # removed. An exception instead unwinds through serve()'s `finally`.
    raise _Terminated()


def read_server_file(home: Path) -> dict[str, Any] | None:
    """The running server's {pid, url}, or None when there is none (or it died uncleanly)."""
    path = home / SERVER_FILE
    try:
        info = json.loads(path.read_text())
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_alive(pid):
        return None
    return dict(info)


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def write_secret(path: Path, text: str) -> None:
    """Write a file only its owner can read, never briefly world-readable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(path, 0o600)


MEMORY_SAYS = {
    True: "memory limits: resources.memory_mb is enforced by the kernel's cgroup memory controller "
    "(a job over it is OOM-killed and reported OOMKilled)",
    False: "memory limits: no writable cgroup memory controller; jobs that set resources.memory_mb "
    "are refused at submit",
}
"""What `sluice up` and the server log say about memory_mb enforcement."""


def job_python_problem(settings: Settings, isolation: Isolation) -> str | None:
    """With isolation on, why a tenant's jobs could not run the job interpreter (None: they
    can, or isolation is off and jobs run as the plane's own user). Judged for the first uid
    of the tenant range: no file belongs to it, so what it may reach, every tenant uid may."""
    if not isolation.enabled:
        return None
    probe = JobUser(settings.job_uid_min, settings.job_uid_min)
    return interpreter_problem(settings.job_python or sys.executable, probe)


def isolation_status(settings: Settings) -> Isolation:
    """Whether this process may run tenants' jobs as their own users under `settings`, and why
    (IsolationUnavailable for isolation=on without the privilege)."""
    return detect_isolation(settings.isolation)


def policy_names() -> list[str]:
    """Policies a server can run (for the CLI to check `--policy` before starting one)."""
    from sluice.policy.registry import policy_names as registered

    return registered()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        why = err.strerror or str(err)
        raise CannotListen(f"cannot listen on {host}:{port} (SLUICE_HOST, SLUICE_PORT or --port): {why}") from None
    # Listening before uvicorn starts: early clients wait in the backlog instead of being refused.
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def engine_record(settings: Settings, engine: object) -> EngineRecord:
    """What this plane runs on, as the home records it (control/engine_record.py)."""
    if settings.engine != "ray":
        return EngineRecord(settings.engine)
    owned = bool(getattr(engine, "owned", False))
    address = getattr(engine, "address", settings.ray_address)
    return EngineRecord("ray", None if owned else address, settings.ray_namespace, jobs_outlive_plane=not owned)


def serve(settings: Settings) -> None:
    """Run the control plane until SIGTERM/SIGINT. Blocks."""
    home = settings.home
    make_home(home)
    running = read_server_file(home)
    if running is not None:
        raise AlreadyRunning(f"a sluice server is already running for {home} at {running.get('url')}")
    home_lock = lock_home(home)  # held until this process ends: see serve's `finally`
    try:
        uids = claim_tenant_uids(settings)
        try:
            _serve_locked(settings, home)
        finally:
            uids.release()
    except StoreNotOpened as err:  # named as the operator set it
        raise StoreNotOpened(f"SLUICE_DATABASE_URL (`database_url`): {err}") from None
    finally:
        os.close(home_lock)


def claim_tenant_uids(settings: Settings) -> UidRangeClaim:
    """With isolation on, this plane's tenant uid range on the host (agent/uid_ranges.py):
    UidRangeInUse where another live plane's overlaps it."""
    if not isolation_status(settings).enabled:
        return UidRangeClaim(None)
    store = open_store(settings.db_url)  # the uids its tenants run as already: maybe from an earlier range
    try:
        held = store.live_uid_span()
    finally:
        store.close()
    return claim_uid_range(
        settings.home, store_of(settings.db_url), settings.job_uid_min, settings.job_uid_max, held=held
    )


def _serve_locked(settings: Settings, home: Path) -> None:
    """`serve`, once this process holds its home (lock_home)."""
    # Imported here so `sluice down` and the CLI's server lookup do not load the web stack.
    import uvicorn

    from sluice.api.app import create_app
    from sluice.api.connections import AcceptErrorsOnce, protocol_with, raise_descriptor_limit
    from sluice.control.plane import ControlPlane

    check_engine(settings)  # before connecting to any engine: jobs of another one must not run twice
    sock = _bind(settings.host, settings.port)
    port = int(sock.getsockname()[1])
    url = _url(settings.host, port)
    try:
        plane = ControlPlane.from_settings(settings)
    except BaseException:
        sock.close()
        raise
    claim = getattr(plane.store, "claim", None)
    if claim is not None:
        try:
            # Before recovery: one database, one plane (store/sql.py SqlStore.claim). The tag
            # is the home's, this process holding the home: a session of it holding the
            # database is its dead predecessor's, which the claim ends.
            claim(tag=plane_tag(home))
        except BaseException:
            plane.engine.close()
            plane.store.close()
            sock.close()
            raise
    server_file = home / SERVER_FILE
    in_main = threading.current_thread() is threading.main_thread()  # signals only work there
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        tokens = plane.bootstrap_tenants()
        if tokens:
            write_secret(home / ADMIN_TOKEN_FILE, tokens["admin"])
            write_secret(home / TOKEN_FILE, tokens["default"])
            log.info("created tenants admin and default; tokens in %s", home)
        app = create_app(plane)  # before the loop starts, so its metrics see every round
        plane.start()
        # Bounds on what any connection costs, token or not (api/connections.py).
        raise_descriptor_limit()
        logging.getLogger("asyncio").addFilter(AcceptErrorsOnce())
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=protocol_with(settings.api_header_timeout_s),
        )
        server = uvicorn.Server(config)
        info = {"pid": os.getpid(), "url": url, "port": port, "home": str(home)}
        # A Ray instance the plane started itself stops with it, and its jobs with it (ray.md):
        # what the engine did, not what the settings said (RAY_ADDRESS joins a cluster).
        record = engine_record(settings, plane.engine)
        write_record(home, record)
        info |= {"engine": record.engine, "jobs_outlive_plane": record.jobs_outlive_plane}
        if record.engine == "ray":
            info |= {
                "ray_address": record.ray_address,
                "ray_address_source": getattr(plane.engine, "address_source", ""),
            }
        info |= {"isolation": plane.isolation.enabled, "isolation_reason": plane.isolation.reason}
        memory = plane.engine.capabilities.memory_limits
        info |= {"memory_limits": memory, "memory_reason": MEMORY_SAYS[memory]}
        found = getattr(plane.engine, "gpu_discovery", None)  # the local engine's; Ray counts its own
        agents = list(getattr(plane.engine, "agents", {}).values())  # the local engine's node agents
        if found is not None and (found.ids or found.left_out):  # a box whose GPUs were all left out says why
            info["gpus"] = found.summary()
            if agents:  # one machine: every virtual node fences the same way
                info["gpu_fence"] = f"GPU fence: {agents[0].fence.describe()}"
                info["gpu_fenced"] = agents[0].fence.enforced
        if plane.isolation.enabled and agents:  # without isolation every job is one uid: nothing to fence
            info["net_fence"] = f"network fence: {agents[0].net_fence.describe}"
            info["net_fenced"] = agents[0].net_fence.available
            missing = agents[0].unix_fence_missing
            info["unix_fence"] = "Unix-socket fence: " + (
                f"jobs are NOT fenced from other jobs' abstract Unix sockets: {missing}"
                if missing
                else "each job reaches only the abstract Unix sockets it made (Landlock)"
            )
            info["unix_fenced"] = not missing
        python_problem = job_python_problem(settings, plane.isolation)
        if python_problem is not None:
            info["job_python_problem"] = python_problem
            log.warning("%s", python_problem)
        write_secret(server_file, json.dumps(info))
        log.info("sluice serving %s (engine %s, policy %s)", url, settings.engine, settings.policy)
        (log.info if plane.isolation.enabled else log.warning)("%s", plane.isolation.reason)
        (log.info if memory else log.warning)("%s", MEMORY_SAYS[memory])
        server.run(sockets=[sock])  # returns after SIGTERM/SIGINT (uvicorn's handlers)
    except (_Terminated, KeyboardInterrupt):
        pass
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        try:
            info = json.loads(server_file.read_text())
            if info.get("pid") == os.getpid():
                server_file.unlink()
        except (OSError, ValueError):
            pass
        plane.stop()
        sock.close()
        log.info("sluice stopped; job processes keep running and are adopted on the next start")


START_ERRORS = (
    AlreadyRunning,
    CannotListen,
    HomeError,
    IsolationUnavailable,
    NetInterfaceUnavailable,
    NodeInUse,
    EngineMismatch,
    RayUnreachable,
    StoreInUse,
    StoreNotOpened,
    UidRangeInUse,
)
"""Why a server cannot start, each said in one line (by `main` and by a foreground `sluice up`)."""


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(load_settings())
    except START_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: cannot serve: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
