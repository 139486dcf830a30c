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
    with store._engine.begin() as conn:  # as version 2 left it
        conn.exec_driver_sql("DROP TABLE deleted_tenants")
        conn.exec_driver_sql("ALTER TABLE tenants DROP COLUMN max_priority")
        conn.exec_driver_sql("UPDATE meta SET value='2' WHERE key='schema_version'")
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
