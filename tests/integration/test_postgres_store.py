"""SqlStore on a real PostgreSQL server started by the test on a loopback port.

The same checks as tests/unit/test_store_contract.py (its `StoreContract` is reused). Skips
with a reason when the PostgreSQL server binaries are not installed (scripts/setup.sh
installs Debian's `postgresql`).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.store.schema import SCHEMA_VERSION
from sluice.store.sql import SqlStore
from tests.integration.conftest import wait_for
from tests.live_api import free_port
from tests.session_env import clean_env

pytestmark = pytest.mark.integration

_spec = importlib.util.spec_from_file_location(
    "store_contract", Path(__file__).resolve().parents[1] / "unit" / "test_store_contract.py"
)
assert _spec is not None and _spec.loader is not None
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)
StoreContract = _contract.StoreContract


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


@pytest.fixture(scope="module")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; run scripts/setup.sh")
    # PostgreSQL refuses to run as root: then run it as the `postgres` user in a folder it owns
    # (pytest's tmp_path lives under a root-only 0700 folder it cannot enter).
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        base = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    else:
        base = tmp_path_factory.mktemp("pg")
    data, sock = base / "data", base
    port = free_port()
    run = lambda *argv: subprocess.run([*as_user, *argv], check=True, capture_output=True, timeout=120)  # noqa: E731
    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", "sluice", "--auth=trust", "-E", "UTF8", "--no-sync")
        run(
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(base / "server.log"),
            "-w",
            "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        yield f"postgresql://sluice@127.0.0.1:{port}/postgres"  # bare scheme: SqlStore picks the driver
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        if as_user:
            shutil.rmtree(base, ignore_errors=True)


class TestPostgresStore(StoreContract):
    @pytest.fixture
    def store(self, pg_url: str) -> Iterator[SqlStore]:
        s = SqlStore(pg_url)
        with s._engine.begin() as conn:  # a clean slate per test; the server is shared by the module
            conn.exec_driver_sql(
                "TRUNCATE jobs, events, tenants, nodes, deleted_tenants, queue_grants, tenant_uids RESTART IDENTITY"
            )
        yield s
        s.close()


def test_schema_survives_reconnect(pg_url: str) -> None:
    first = SqlStore(pg_url)
    first.append_event(1.0, "phase", "kept")
    first.close()
    again = SqlStore(pg_url)
    try:
        assert "kept" in [e.message for e in again.events()]
        assert again.schema_version == SCHEMA_VERSION
    finally:
        again.close()


def _rewind(store: SqlStore, version: int, *statements: str) -> None:
    """Make the database look as schema `version` left it: run `statements` (dropping what later
    versions added) and set its recorded version."""
    with store._engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql("UPDATE meta SET value=%s WHERE key='schema_version'", (str(version),))


def test_a_version_2_database_is_brought_forward(pg_url: str) -> None:
    """Version 3's step on PostgreSQL: tenants get `max_priority`; a tenant deleted before
    (its name on a job and a grant, no tenant row) has its name recorded and its grant dropped."""
    from sluice.store import TenantRecord

    store = SqlStore(pg_url)
    with store._engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs, tenants, deleted_tenants, queue_grants, tenant_uids")
    store.create_tenant(TenantRecord("bob", "hash-b"))
    store.create_job(_contract.make_job("old-1", tenant="carol"))
    store.grant_queue("research", "carol")
    store.grant_queue("research", "bob")
    _rewind(  # as version 2 left it
        store,
        2,
        "DROP TABLE deleted_tenants",
        "ALTER TABLE tenants DROP COLUMN max_priority",
    )
    store.close()
    again = SqlStore(pg_url)
    try:
        assert again.schema_version == SCHEMA_VERSION
        assert again.tenant_deleted_at("carol") == 0.0 and again.tenant_deleted_at("bob") is None
        assert again.queue_grants() == {"research": ["bob"]}
        bob = again.get_tenant("bob")
        assert bob is not None and bob.max_priority is None
    finally:
        again.close()


def test_a_version_5_database_gets_run_until_and_cpu_used(pg_url: str) -> None:
    """Version 6's step on PostgreSQL: jobs get `run_until`, `cpu_used_s`, `attempt_cpu_s`, held
    time `cpu_used_s`; what was there before is kept (0 used, no run_until). And version 8's:
    jobs' `disk_mb` (none measured), tenants' `max_disk_mb`."""
    from dataclasses import replace

    from sluice.store.base import HeldTime

    store = SqlStore(pg_url)
    with store._engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs, held_time")
    store.create_job(replace(_contract.make_job("old-6"), run_s=30.0))
    store.add_held_time([HeldTime("alice", 3600.0, False, 10.0, 5.0)])
    _rewind(  # as version 5 left it
        store,
        5,
        "ALTER TABLE jobs DROP COLUMN run_until",
        "ALTER TABLE jobs DROP COLUMN cpu_used_s",
        "ALTER TABLE jobs DROP COLUMN attempt_cpu_s",
        "ALTER TABLE held_time DROP COLUMN cpu_used_s",
        "ALTER TABLE jobs DROP COLUMN disk_mb",  # and version 8's (7 added none here)
        "ALTER TABLE tenants DROP COLUMN max_disk_mb",
    )
    store.close()
    again = SqlStore(pg_url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        job = again.get_job("old-6")
        assert job is not None and job.run_s == 30.0 and job.run_until is None and job.cpu_used_s == 0.0
        assert job.disk_mb is None
        again.save_job(replace(job, run_until=12.5, cpu_used_s=3.0, attempt_cpu_s=3.0))
        assert again.get_job("old-6") == replace(job, run_until=12.5, cpu_used_s=3.0, attempt_cpu_s=3.0)
        again.add_held_time([HeldTime("alice", 3600.0, False, 1.0, 1.0, 2.5)])
        assert again.held_time() == [HeldTime("alice", 0.0, False, 11.0, 6.0, 2.5)]
    finally:
        again.close()


def test_a_version_7_database_gets_the_job_disk_column_and_the_tenant_disk_cap(pg_url: str) -> None:
    """Version 8's step on PostgreSQL: jobs get `disk_mb` (null: never measured), tenants
    `max_disk_mb` (null: no cap); what was there is kept."""
    from dataclasses import replace

    from sluice.control.auth import hash_token
    from sluice.store.base import TenantRecord

    store = SqlStore(pg_url)
    with store._engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE jobs")
    store.create_job(replace(_contract.make_job("old-7"), cpu_used_s=4.0))
    if store.get_tenant("old-7-tenant") is None:
        store.create_tenant(TenantRecord("old-7-tenant", hash_token("t7")))
    _rewind(  # as version 7 left it
        store,
        7,
        "ALTER TABLE jobs DROP COLUMN disk_mb",
        "ALTER TABLE tenants DROP COLUMN max_disk_mb",
    )
    store.close()
    again = SqlStore(pg_url)
    try:
        assert again.schema_version == SCHEMA_VERSION == 8
        job = again.get_job("old-7")
        assert job is not None and job.disk_mb is None and job.cpu_used_s == 4.0
        again.save_job(replace(job, disk_mb=12.5))
        assert again.get_job("old-7") == replace(job, disk_mb=12.5)
        tenant = again.get_tenant("old-7-tenant")
        assert tenant is not None and tenant.max_disk_mb is None
    finally:
        again.close()


def test_one_database_serves_one_plane(pg_url: str) -> None:
    """A second plane on the same PostgreSQL database re-ran the first's running jobs
    (walkthrough 4): the advisory lock a plane holds refuses it, and goes with the session."""
    from sluice.store import StoreInUse

    first, second = SqlStore(pg_url), SqlStore(pg_url)
    try:
        first.claim()
        with pytest.raises(StoreInUse, match="one database serves one plane"):
            second.claim()
        first.close()
        second.claim()
    finally:
        first.close()
        second.close()


def _end_session_of(pg_url: str, store: SqlStore) -> None:
    """What a PostgreSQL restart does to a plane: its claim session (and the lock) ends."""
    claim = store._claim
    assert claim is not None and not isinstance(claim, int)
    pid = claim.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    claim.rollback()
    other = SqlStore(pg_url)
    try:
        with other._engine.begin() as conn:
            assert conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar()
        # pg_terminate_backend only signals: the session (and its lock) ends a moment later.
        gone = f"SELECT count(*) FROM pg_stat_activity WHERE pid = {int(pid)}"

        def ended() -> bool:
            with other._engine.connect() as conn:
                return conn.exec_driver_sql(gone).scalar() == 0

        assert wait_for(ended, 10), "the terminated session did not end"
    finally:
        other.close()


def test_a_plane_whose_session_ended_takes_its_database_again_or_learns_it_was_taken(pg_url: str) -> None:
    """The advisory lock lives with the session: after a server restart the first plane held
    nothing, and a second plane could claim the database while the first ran its jobs."""
    from sluice.store import StoreInUse

    first, second = SqlStore(pg_url), SqlStore(pg_url)
    try:
        first.claim()
        first.keep_claim()  # held: nothing to do
        _end_session_of(pg_url, first)
        first.keep_claim()  # nobody took it meanwhile: taken again
        with pytest.raises(StoreInUse):
            second.claim()
        _end_session_of(pg_url, first)
        second.claim()  # the second plane came first this time
        with pytest.raises(StoreInUse, match="one database serves one plane"):
            first.keep_claim()
    finally:
        first.close()
        second.close()


class CuttableLink:
    """A TCP relay on loopback between a plane and PostgreSQL, to cut the network the way a
    partition does: the plane's side of each connection fails at once, while the server's
    side stays open and silent, so its session (and the lock it holds) lingers — as it would
    until the server's TCP keepalives gave up, hours by default."""

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.cut_off = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: Any, dst: Any) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data or self.cut_off.is_set():
                    return
                dst.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        """Every connection open now: the plane's end is closed, the server's left hanging."""
        import socket

        self.cut_off.set()
        for client, _server in self.pairs:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()
        self.pairs = []
        self.cut_off.clear()  # connections made after the cut work

    def close(self) -> None:
        self.listener.close()
        for client, server in self.pairs:
            client.close()
            server.close()


def test_after_a_network_cut_a_plane_ends_its_own_lingering_session_and_keeps_its_database(pg_url: str) -> None:
    """A network cut left the plane's old session (and lock) alive at the server: the plane
    read the lock as another plane's and stopped, until an operator restarted it. It now ends
    its own session (tagged with its application_name) and goes on; a real other plane's
    session is never ended."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from sluice.store import StoreInUse

    real = make_url(pg_url)
    assert real.port is not None
    link = CuttableLink(real.port)
    first = SqlStore(real.set(port=link.port).render_as_string(hide_password=False))
    second = SqlStore(pg_url)
    try:
        first.claim()
        link.cut()
        first._engine.dispose()  # the pool's connections were cut too
        lingering = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        with second._engine.connect() as conn:
            assert conn.execute(text(lingering)).scalar() == 1, "the cut session lives on at the server"
        with pytest.raises(StoreInUse):
            second.claim()  # ... holding the lock
        first.keep_claim()  # its own: ended and taken back (before: StoreInUse, and the plane stopped)
        with pytest.raises(StoreInUse):
            second.claim()
        first.close()

        def released() -> bool:
            with second._engine.connect() as conn:
                return conn.execute(text(lingering)).scalar() == 0

        # Closing sends the server its goodbye through the relay's threads: the session (and
        # the lock) ends a moment after close returns (a claim straight after failed 1 run in 4
        # on a loaded 2-core machine).
        assert wait_for(released, timeout=10), "first's session ended at the server"
        second.claim()
        third = SqlStore(real.set(port=link.port).render_as_string(hide_password=False))
        try:
            with pytest.raises(StoreInUse, match="one database serves one plane"):
                third.claim()  # another plane's session is not its own: never ended
        finally:
            third.close()
    finally:
        first.close()
        second.close()
        link.close()


class PlaneProcess:
    """A real control plane (`python -m sluice.server`, local engine) on a home and database."""

    def __init__(self, home: Path, db_url: str, cgroup_root: str | None = None) -> None:
        import sys

        env = clean_env()
        env |= {
            "SLUICE_HOME": str(home),
            "SLUICE_DATABASE_URL": db_url,
            "SLUICE_PORT": "0",
            "SLUICE_HOST": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(sys.path),  # this checkout's sluice
        }
        if cgroup_root is not None:
            env["SLUICE_CGROUP_ROOT"] = cgroup_root
        self.home = home
        self.log = home.parent / f"plane-{len(list(home.parent.glob('plane-*.log')))}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.server"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def serving(self) -> bool:
        """server.json names this process: it claimed the database and serves."""
        import json

        try:
            return int(json.loads((self.home / "server.json").read_text())["pid"]) == self.proc.pid
        except (OSError, ValueError, KeyError):
            return False

    def wait_serving(self) -> None:
        assert wait_for(lambda: self.serving() or self.proc.poll() is not None, 90), self.log.read_text()
        assert self.serving(), f"the plane exited {self.proc.returncode}: {self.log.read_text()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _lock_holders(pg_url: str) -> list[tuple[int, str]]:
    """(backend pid, application_name) of each session holding a plane's lock."""
    from sqlalchemy import create_engine

    from sluice.store.sql import PLANE_LOCK_KEY, _pg_url

    engine = create_engine(_pg_url(pg_url))
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT a.pid, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                f"WHERE l.locktype = 'advisory' AND l.granted AND l.classid = {PLANE_LOCK_KEY >> 32} "
                f"AND l.objid = {PLANE_LOCK_KEY & 0xFFFFFFFF}"
            ).all()
        return [(int(pid), str(name)) for pid, name in rows]
    finally:
        engine.dispose()


def test_a_restarted_plane_ends_its_dead_predecessors_lingering_session(pg_url: str, tmp_path: Path) -> None:
    """A plane killed (kill -9 here; a crash, a host reboot) while the network did not tell
    the server: its session lingers there, holding the lock. The restarted plane got a new
    random tag, so it was refused as another plane's until the server dropped the session
    (hours, by TCP keepalives). The tag now lives in the home: the new plane knows the session
    for its predecessor's, ends it and serves."""
    import json

    from sqlalchemy.engine import make_url

    real = make_url(pg_url)
    assert real.port is not None
    link = CuttableLink(real.port)  # a killed plane's connections end at the relay, not at the server
    home = tmp_path / "home"
    first = PlaneProcess(home, real.set(port=link.port).render_as_string(hide_password=False))
    second: PlaneProcess | None = None
    try:
        first.wait_serving()
        tag = json.loads((home / "plane-tag").read_text())["tag"]
        [(old_pid, held_by)] = _lock_holders(pg_url)
        assert held_by == tag
        first.proc.kill()
        first.proc.wait()
        assert _lock_holders(pg_url) == [(old_pid, tag)], "the dead plane's session lingers, holding the lock"
        second = PlaneProcess(home, pg_url)
        second.wait_serving()  # before: "another control plane is connected to the database"
        assert "left by this plane before a restart" in second.log.read_text()
        [(new_pid, held_by)] = _lock_holders(pg_url)
        assert held_by == tag and new_pid != old_pid
    finally:
        first.stop()
        if second is not None:
            second.stop()
        link.close()


def test_a_second_plane_on_the_same_home_is_refused_and_never_ends_the_live_ones_session(
    pg_url: str, tmp_path: Path
) -> None:
    """Both planes of one home have its tag: the second must not take the first's live
    session for a dead predecessor's and end it. The home's lock refuses it first — also
    when it starts before the first has written its server.json (started at once; moved
    aside here to make that moment last). The second has a cgroup root of its own, as the
    local engine's refusal of shared node cgroups tells an operator to do (and as on Ray,
    which has none): before the lock, it then went on to the database."""
    from uuid import uuid4

    home = tmp_path / "home"
    first = PlaneProcess(home, pg_url)
    try:
        first.wait_serving()
        [holder] = _lock_holders(pg_url)
        (home / "server.json").rename(home / "server.json.aside")
        own_root = f"{os.environ.get('SLUICE_CGROUP_ROOT', 'sluice-tests')}-second-{uuid4().hex[:6]}"
        second = PlaneProcess(home, pg_url, cgroup_root=own_root)
        try:
            assert wait_for(lambda: second.proc.poll() is not None or second.serving(), 90), second.log.read_text()
            assert second.proc.poll() == 1, second.log.read_text()  # not serving: refused
        finally:
            second.stop()
        said = second.log.read_text()
        assert f"error: a sluice server (pid {first.proc.pid}) is already running for {home}" in said, said
        assert _lock_holders(pg_url) == [holder], "the live plane's session was ended"
        assert first.proc.poll() is None
        (home / "server.json.aside").rename(home / "server.json")
    finally:
        first.stop()
        if "own_root" in locals():
            from sluice.agent.cgroup import remove_root

            remove_root(own_root, Path("/sys/fs/cgroup"))


def test_a_lingering_session_the_server_will_not_let_the_plane_end_is_a_database_in_use(pg_url: str) -> None:
    """PostgreSQL may refuse pg_terminate_backend (a superuser's session, a role the plane is no
    member of): that is a database still held, StoreInUse, as a claim says, not a raw database
    error out of `claim` (at start a traceback; in `keep_claim` a failed round, the reconcile
    loop going on) with the claim's connection left checked out."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from sluice.store import StoreInUse
    from sluice.store.sql import PLANE_LOCK_KEY, _pg_url

    admin = create_engine(_pg_url(pg_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql("DROP DATABASE IF EXISTS plane_db")
        conn.exec_driver_sql("DROP ROLE IF EXISTS plane")
        conn.exec_driver_sql("CREATE ROLE plane LOGIN")
        conn.exec_driver_sql("CREATE DATABASE plane_db OWNER plane")
    base = make_url(pg_url)
    store = SqlStore(base.set(username="plane", database="plane_db").render_as_string(hide_password=False))
    su = create_engine(_pg_url(base.set(database="plane_db").render_as_string(hide_password=False)))
    holder = su.connect()
    try:
        # a superuser's session carrying the plane's tag holds the lock
        holder.execute(text("SELECT set_config('application_name', :tag, false)"), {"tag": store._claim_tag})
        holder.exec_driver_sql(f"SELECT pg_advisory_lock({PLANE_LOCK_KEY})")
        holder.commit()
        with pytest.raises(StoreInUse):
            store.claim()
        assert store._engine.pool.checkedout() == 0, "the claim's connection was left checked out"
    finally:
        holder.close()
        su.dispose()
        store.close()
        with admin.connect() as conn:
            conn.exec_driver_sql("DROP DATABASE IF EXISTS plane_db WITH (FORCE)")
            conn.exec_driver_sql("DROP ROLE IF EXISTS plane")
        admin.dispose()


def test_a_partition_that_drops_packets_ends_a_read_in_seconds_not_minutes(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition drops packets rather than resetting connections: a read on the plane's
    claim session waited for the kernel's retransmissions (~15 min with the default
    tcp_retries2), and the reconcile loop that checks the claim waited with it. With libpq's
    keepalives and tcp_user_timeout (sql.PG_CONNECT_ARGS, shortened here) the check fails in
    seconds; once the network is back the plane ends its own lingering session and goes on.
    The partition is real: an nftables rule drops the relay port's packets on loopback."""
    import secrets
    import time

    from sqlalchemy.engine import make_url

    import sluice.store.sql as sql
    from sluice.store import StoreUnavailable

    nft = shutil.which("nft")
    if nft is None or os.geteuid() != 0:
        pytest.skip("needs root and nftables (nft) to drop packets")
    monkeypatch.setattr(sql, "PG_CONNECT_ARGS", {**sql.PG_CONNECT_ARGS, "tcp_user_timeout": 2000, "connect_timeout": 2})
    real = make_url(pg_url)
    assert real.port is not None
    link = CuttableLink(real.port)
    first = SqlStore(real.set(port=link.port).render_as_string(hide_password=False))
    table = f"sluice_test_{secrets.token_hex(4)}"
    rules = [
        [nft, "add", "table", "inet", table],
        [nft, "add", "chain", "inet", table, "out", "{ type filter hook output priority 0; }"],
        [nft, "add", "rule", "inet", table, "out", "tcp", "dport", str(link.port), "drop"],
        [nft, "add", "rule", "inet", table, "out", "tcp", "sport", str(link.port), "drop"],
    ]
    made = subprocess.run(rules[0], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        link.close()
        first.close()
        pytest.skip(f"nftables unusable here: {made.stderr.strip()}")
    try:
        first.claim()
        for argv in rules[1:]:
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            first.keep_claim()  # the read times out; a new connection cannot be made either
        assert time.monotonic() - started < 30, "the claim check waited on the partition"
        subprocess.run([nft, "delete", "table", "inet", table], check=True, capture_output=True, timeout=30)
        first.keep_claim()  # back: its own lingering session ended, the lock taken again
        second = SqlStore(pg_url)
        try:
            from sluice.store import StoreInUse

            with pytest.raises(StoreInUse):
                second.claim()
        finally:
            second.close()
    finally:
        subprocess.run([nft, "delete", "table", "inet", table], capture_output=True, timeout=30)
        first.close()
        link.close()
