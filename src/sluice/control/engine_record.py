"""Which engine (and Ray cluster) placed this home's jobs, kept in the home.

The store's attempts do not say which engine ran them. A plane restarted on the same home with
another engine (a forgotten `--engine ray`, another `--address`) could not see the first
engine's running processes, took them for gone and ran every job again beside its still
running copy. So each server writes `engine.json` in its home when its engine is up, and
`sluice up` (and the server itself, before it connects to anything) refuses to start with
another engine while jobs the recorded one placed may still be running: active jobs
(Starting/Running/Stopping) under an engine whose jobs outlive the plane. Nothing is changed
by a refusal; the same home started as recorded adopts the jobs as before.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sluice.engine.ray_connect import resolve_address
from sluice.model import Phase
from sluice.settings import Settings

RECORD_FILE = "engine.json"
ACTIVE_PHASES = (Phase.STARTING, Phase.RUNNING, Phase.STOPPING)


class EngineMismatch(RuntimeError):
    """The home's running jobs were placed by another engine (or Ray cluster); the message is
    one line naming the engine and the flags to start with."""


@dataclass(frozen=True)
class EngineRecord:
    engine: str
    ray_address: str | None = None
    """The Ray cluster joined (None: a one-node instance the plane started itself)."""
    ray_namespace: str | None = None
    jobs_outlive_plane: bool = True
    """False for a Ray instance the plane started: it stopped with the plane, and its jobs too."""

    def same_place(self, other: EngineRecord) -> bool:
        if self.engine != other.engine:
            return False
        if self.engine != "ray":
            return True
        return (self.ray_address, self.ray_namespace) == (other.ray_address, other.ray_namespace)

    def describe(self, namespace: bool = False) -> str:
        """`namespace`: name the Ray namespace even when it is the default."""
        if self.engine != "ray":
            return f"the {self.engine} engine"
        where = f" at {self.ray_address}" if self.ray_address else " on the one-node instance it started"
        named = namespace or self.ray_namespace != "sluice"
        ns = f" (namespace {self.ray_namespace})" if self.ray_namespace and named else ""
        return f"the ray engine{where}{ns}"

    def flags(self) -> str:
        """The `sluice up` command line that starts a plane with this engine again."""
        if self.engine != "ray":
            return f"sluice up --engine {self.engine}"
        out = "sluice up --engine ray" + (f" --address {self.ray_address}" if self.ray_address else "")
        if self.ray_namespace and self.ray_namespace != "sluice":
            out = f"SLUICE_RAY_NAMESPACE={self.ray_namespace} {out}"
        return out


def intended(settings: Settings) -> EngineRecord:
    """What a plane started with `settings` (and this environment's RAY_ADDRESS) would run."""
    if settings.engine != "ray":
        return EngineRecord(settings.engine)
    address, _ = resolve_address(settings.ray_address)
    return EngineRecord("ray", address, settings.ray_namespace, jobs_outlive_plane=address is not None)


def read_record(home: Path) -> EngineRecord | None:
    try:
        data = json.loads((home / RECORD_FILE).read_text())
        return EngineRecord(
            engine=str(data["engine"]),
            ray_address=data.get("ray_address"),
            ray_namespace=data.get("ray_namespace"),
            jobs_outlive_plane=bool(data.get("jobs_outlive_plane", True)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(home: Path, record: EngineRecord) -> None:
    """Atomically (a torn file would read as no record)."""
    tmp = home / f".{RECORD_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(asdict(record)) + "\n")
    os.replace(tmp, home / RECORD_FILE)


def check_engine(settings: Settings) -> None:
    """EngineMismatch when this home has active jobs placed by another engine or Ray cluster
    whose jobs outlive the plane; nothing to say without a record (a home from before records,
    or one never served) or without active jobs."""
    before = read_record(settings.home)
    if before is None or not before.jobs_outlive_plane:
        return
    now = intended(settings)
    if before.same_place(now):
        return
    from sluice.store import open_store  # here: `sluice up`'s check alone should not load more

    store = open_store(settings.db_url)
    try:
        active = store.list_jobs(phases=ACTIVE_PHASES)
    finally:
        store.close()
    if not active:
        return
    n = len(active)
    ns = before.engine == now.engine == "ray" and before.ray_address == now.ray_address
    jobs = f"{n} running job" + ("s were" if n > 1 else " was")
    raise EngineMismatch(
        f"this home's {jobs} placed by {before.describe(ns)}, not {now.describe(ns)}; start with "
        f"`{before.flags()}`, or cancel them there first (they would run twice)"
    )
