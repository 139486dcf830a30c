"""`sluice up` and `sluice down`: start and stop the control-plane server for $SLUICE_HOME.

Detached, the server runs as `python -m sluice.server` in its own session (it
survives the terminal), configured through SLUICE_* variables — an argv list and an
environment, never a shell line. `down` sends SIGTERM: the server stops gracefully and job
processes keep running, to be adopted by the next `up`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import httpx
import typer

from sluice.cli.output import console, err_console
from sluice.control.engine_record import intended
from sluice.server import (
    START_ERRORS,
    EngineMismatch,
    HomeError,
    IsolationUnavailable,
    check_engine,
    isolation_status,
    make_home,
    pid_alive,
    policy_names,
    read_server_file,
    serve,
)
from sluice.settings import Settings, check_ray_address, load_settings, misspelled_variables

UP_TIMEOUT_S = 120.0
"""How long `up --detach` waits for /healthz (a Ray engine may take a while to start)."""
DOWN_TIMEOUT_S = 60.0
"""How long `down` waits for the server to finish its graceful stop."""
STOP_CHILD_S = 5.0
"""How long `up --detach`, giving up, waits for the server it started to exit on SIGTERM
before it SIGKILLs it (a server stuck joining a cluster may not heed SIGTERM)."""
LIVE_JOBS_ASK_S = 3.0
"""How long `down` waits for the plane to say how many jobs run, before it stops it."""
SERVER_COMMAND = [sys.executable, "-m", "sluice.server"]
"""The detached server's argv (tests put a stand-in here)."""


class EngineName(StrEnum):
    local = "local"
    ray = "ray"


def _settings(
    policy: str | None, engine: EngineName | None, port: int | None, address: str | None = None
) -> tuple[Settings, dict[str, str]]:
    overrides: dict[str, object] = {
        "policy": policy,
        "engine": engine.value if engine else None,
        "port": port,
        "ray_address": address,
    }
    env = {f"SLUICE_{k.upper()}": str(v) for k, v in overrides.items() if v is not None}
    return load_settings(**overrides), env


HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home",
        file_okay=False,
        help="State folder to use instead of $SLUICE_HOME (default ~/.sluice); other commands "
        "(`sluice down` too) find this server with SLUICE_HOME set to the same folder.",
    ),
]


@contextlib.contextmanager
def _home(home: Path | None) -> Iterator[None]:
    """Run as if $SLUICE_HOME were `home` (its settings.yaml included), then put it back:
    the same as setting the variable, without leaking it past the command."""
    if home is None:
        yield
        return
    before = os.environ.get("SLUICE_HOME")
    os.environ["SLUICE_HOME"] = str(home.expanduser().resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SLUICE_HOME", None)
        else:
            os.environ["SLUICE_HOME"] = before


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _say_isolation(settings: Settings) -> None:
    """Tell the operator, before anything runs, whether tenants' jobs are isolated."""
    try:
        iso = isolation_status(settings)
    except IsolationUnavailable as err:
        err_console.print(f"error: {err}", markup=False)
        raise typer.Exit(1) from None
    (console if iso.enabled else err_console).print(("" if iso.enabled else "warning: ") + iso.reason, markup=False)


def up(
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Run in the background and return.")] = False,
    policy: Annotated[str | None, typer.Option(help="Scheduling policy (e.g. flowcon, kube).")] = None,
    engine: Annotated[EngineName | None, typer.Option(help="Where jobs run: local or ray.")] = None,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help="API port; 0 picks a free one.")] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="Ray cluster to join with --engine ray: host:port of its GCS (e.g. 10.0.0.5:6379) or "
            "ray://host:port; none: RAY_ADDRESS if set (said so), else a fresh one-node instance."
        ),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Start the control plane (reconcile loop + REST API) for $SLUICE_HOME (or --home)."""
    with _home(home):
        _up(detach, policy, engine, port, address)


def _ray_address(settings: Settings, flag: str | None) -> str:
    """Check the Ray address `up` would join (exit 2 naming where it came from) and say which
    cluster that is, in one line: the one `up` prints and the server logs."""
    env_address = os.environ.get("RAY_ADDRESS", "").strip()
    if flag is not None:
        where, text = "--address", flag
    elif settings.ray_address is not None:
        where, text = "ray_address (SLUICE_RAY_ADDRESS or settings.yaml)", settings.ray_address
    elif env_address and env_address != "local":
        where, text = "RAY_ADDRESS", env_address
    else:
        return "the ray engine starts a one-node Ray instance owned by this plane; its jobs stop with it"
    try:
        form, _host, _port = check_ray_address(text)
    except ValueError as err:
        err_console.print(f"error: {where}: {err}", markup=False)
        raise typer.Exit(2) from None
    if form == "local":
        return "the ray engine starts a one-node Ray instance owned by this plane; its jobs stop with it"
    source = " (from RAY_ADDRESS)" if where == "RAY_ADDRESS" else ""
    return f"the ray engine joins the Ray cluster at {text.strip()}{source}"


def _engine_text(engine: str, ray_address: str | None) -> str:
    if engine != "ray":
        return f"the {engine} engine"
    return f"the ray engine at {ray_address}" if ray_address else "the ray engine's own one-node instance"


def _runs_otherwise(running: dict[str, object], settings: Settings) -> str | None:
    """How the running server differs from the engine and Ray address `up` was asked for
    (`with the ray engine at X, not the local engine`), or None when it runs that."""
    want = intended(settings)
    engine = str(running.get("engine") or "local")
    raw = running.get("ray_address")
    address = str(raw) if engine == "ray" and raw else None
    if engine == want.engine and (engine != "ray" or address == want.ray_address):
        return None
    return f"with {_engine_text(engine, address)}, not {_engine_text(want.engine, want.ray_address)}"


def _up(detach: bool, policy: str | None, engine: EngineName | None, port: int | None, address: str | None) -> None:
    settings, env = _settings(policy, engine, port, address)
    for line in misspelled_variables(os.environ):
        err_console.print(f"warning: {line}", markup=False)
    known = policy_names()
    if settings.policy not in known:  # named `--policy` when it came from SLUICE_POLICY or settings.yaml
        where = "--policy" if policy is not None else "policy (SLUICE_POLICY or settings.yaml)"
        err_console.print(
            f"error: {where}: unknown policy {settings.policy!r}; choose one of {', '.join(known)}", markup=False
        )
        raise typer.Exit(2)
    if address is not None and settings.engine != "ray":
        err_console.print("error: --address: names a Ray cluster; use it with --engine ray", markup=False)
        raise typer.Exit(2)
    joining = _ray_address(settings, address) if settings.engine == "ray" else None
    try:
        make_home(settings.home)
    except HomeError as err:
        err_console.print(f"error: {err}", markup=False)
        raise typer.Exit(1) from None
    running = read_server_file(settings.home)
    if running is not None:
        here = f"sluice is already running at {running['url']} (pid {running['pid']})"
        other = _runs_otherwise(running, settings) if engine is not None or address is not None else None
        if other is not None:
            err_console.print(f"error: {here} {other}; `sluice down` first to change it", markup=False)
            raise typer.Exit(1)
        console.print(here, markup=False)
        return
    try:
        check_engine(settings)
    except EngineMismatch as err:
        err_console.print(f"error: {err}", markup=False)
        raise typer.Exit(1) from None
    if joining is not None:
        console.print(joining, markup=False)
    if not detach:
        console.print(f"starting sluice in {settings.home} (Ctrl-C stops it)", markup=False)
        _say_isolation(settings)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            serve(settings)
        except (*START_ERRORS, OSError) as err:
            err_console.print(f"error: {err}", markup=False)
            raise typer.Exit(1) from None
        return
    log_path = str(settings.home / "server.log")
    with open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        os.fchmod(log.fileno(), 0o600)
        proc = subprocess.Popen(
            SERVER_COMMAND,
            env={**os.environ, **env, "SLUICE_HOME": str(settings.home)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _tail(log_path)
            last = tail.rstrip("\n").rpartition("\n")[2]
            if last.startswith("error: "):  # the server said why in one line (main()): that line alone
                err_console.print(last, markup=False)
                raise typer.Exit(1)
            err_console.print(f"error: the server exited with code {proc.returncode}; its log ({log_path}):")
            err_console.print(tail, markup=False)
            raise typer.Exit(1)
        info = read_server_file(settings.home)
        if info is not None and info.get("pid") == proc.pid and _healthy(str(info["url"])):
            if "isolation_reason" in info:
                (console if info.get("isolation") else err_console).print(
                    ("" if info.get("isolation") else "warning: ") + str(info["isolation_reason"]), markup=False
                )
            if info.get("memory_limits") is False:
                err_console.print(f"warning: {info.get('memory_reason', '')}", markup=False)
            if info.get("job_python_problem"):
                err_console.print(f"warning: {info['job_python_problem']}", markup=False)
            if info.get("gpus"):
                console.print(str(info["gpus"]), markup=False)
            if info.get("net_fence"):
                fenced = info.get("net_fenced") is True
                (console if fenced else err_console).print(
                    ("" if fenced else "warning: ") + str(info["net_fence"]), markup=False
                )
            if info.get("unix_fence"):
                fenced = info.get("unix_fenced") is True
                (console if fenced else err_console).print(
                    ("" if fenced else "warning: ") + str(info["unix_fence"]), markup=False
                )
            if info.get("gpu_fence"):
                fenced = info.get("gpu_fenced") is True
                (console if fenced else err_console).print(
                    ("" if fenced else "warning: ") + str(info["gpu_fence"]), markup=False
                )
            # The URL alone is the last line (for `$(sluice up -d | tail -1)`), and only there.
            console.print(f"sluice is up (pid {proc.pid}; log {log_path}) at", markup=False)
            typer.echo(info["url"])
            return
        time.sleep(0.2)
    _stop_child(proc)
    err_console.print(
        f"error: the server did not answer within {UP_TIMEOUT_S:.0f}s and was stopped (pid {proc.pid}); see {log_path}",
        markup=False,
    )
    raise typer.Exit(1)


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    """End the server `up --detach` started and gave up on, with whatever it started in its
    session: never leave one running that no server.json names (`down` could not find it)."""
    for sig, wait_s in ((signal.SIGTERM, STOP_CHILD_S), (signal.SIGKILL, STOP_CHILD_S)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # its own session (start_new_session): pgid == pid
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
            return


def _live_jobs(url: str, settings: Settings) -> int | None:
    """How many jobs have processes on the nodes now (every tenant's), asked of the plane with
    the admin token before it stops: `down` then says what keeps running, rather than that
    jobs keep running when none ran. None when it cannot tell (no admin token readable, no
    answer in LIVE_JOBS_ASK_S): `down` then says it as before."""
    from sluice.client import Client, SluiceError
    from sluice.client.config import token_file
    from sluice.model.phase import ACTIVE

    token = token_file(settings)  # the file, never SLUICE_TOKEN: a tenant's would count its jobs alone
    if not url or not token:
        return None
    try:
        with Client(url, token, timeout_s=LIVE_JOBS_ASK_S) as client:
            return len(client.jobs(phase=sorted(ACTIVE)))
    except (SluiceError, ValueError, OSError):
        return None


def down() -> None:
    """Stop the control plane gracefully. Job processes keep running and `sluice up` adopts
    them — except on a one-node Ray instance the plane started itself, which stops with it:
    its jobs resume from their checkpoints at the next `sluice up`."""
    settings = load_settings()
    info = read_server_file(settings.home)
    if info is None:
        console.print(f"no sluice server is running for {settings.home}", markup=False)
        return
    pid = int(info["pid"])
    live = _live_jobs(str(info.get("url", "")), settings)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while time.monotonic() < deadline:
        # Gone, not only its server.json: a server removes that first and then stops its plane
        # and agents, and a `sluice up` in between would find the node still held.
        if not pid_alive(pid):
            if live == 0:
                with_ray = "" if info.get("jobs_outlive_plane", True) else " with the Ray instance it started"
                console.print(f"sluice stopped (pid {pid}){with_ray}; no job was running", markup=False)
            elif info.get("jobs_outlive_plane", True):
                where = ""
                if info.get("engine") == "ray" and info.get("ray_address"):
                    source = " (from RAY_ADDRESS)" if info.get("ray_address_source") == "RAY_ADDRESS" else ""
                    where = f" on the Ray cluster at {info['ray_address']}{source}, which sluice did not start"
                plural = "s keep" if live is not None and live > 1 else " keeps"
                jobs = "running jobs keep" if live is None else f"{live} running job{plural}"
                console.print(f"sluice stopped (pid {pid}); {jobs} running{where}", markup=False)
            else:
                console.print(
                    f"sluice stopped (pid {pid}) with the Ray instance it started; its jobs stopped too and "
                    "resume from their checkpoints at the next `sluice up`",
                    markup=False,
                )
            return
        time.sleep(0.2)
    err_console.print(f"error: the server (pid {pid}) is still stopping after {DOWN_TIMEOUT_S:.0f}s")
    raise typer.Exit(1)
