"""The node cache's index: what each tier holds, its checksum, and its LRFU statistics.

One SQLite file per node, shared by every process that reads through the cache (WAL mode, so
readers never block writers). It is what makes the cache crash-safe: an item counts as cached
only once its bytes were fsynced, renamed into place *and* recorded here with size and CRC,
and recovery after a crash checks the files against it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.data.eviction import Entry, choose_victims, decay

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    ds TEXT NOT NULL, key TEXT NOT NULL, tier TEXT NOT NULL,
    size INTEGER NOT NULL, crc INTEGER NOT NULL, cost REAL NOT NULL,
    crf REAL NOT NULL, last REAL NOT NULL,
    PRIMARY KEY (ds, key, tier)
);
CREATE TABLE IF NOT EXISTS tiers (tier TEXT PRIMARY KEY, used INTEGER NOT NULL, capacity INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    ds TEXT PRIMARY KEY, name TEXT NOT NULL, source TEXT NOT NULL, items INTEGER NOT NULL, total INTEGER NOT NULL
);
"""

LOW_WATERMARK = 0.9
"""Eviction frees down to this share of capacity, so it runs once per many inserts, not per insert."""


@dataclass(frozen=True)
class Victim:
    ds: str
    key: str
    tier: str
    size: int


class Index:
    def __init__(self, path: str, lam: float) -> None:
        self.path = path
        self.lam = lam
        self._local = threading.local()
        self._db().executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            # A connection must not cross fork() (DataLoader workers): each process opens its own.
            db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            lam = self.lam
            db.create_function("sluice_decay", 1, lambda dt: decay(lam, float(dt or 0.0)), deterministic=True)
            self._local.db = db
            self._local.pid = os.getpid()
        return db

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")

    def _tx(self) -> Index._Tx:
        return Index._Tx(self._db())

    # -- tiers -------------------------------------------------------------------------------
    def set_capacity(self, tier: str, capacity: int) -> list[Victim]:
        """Set a tier's size; shrinking it returns the entries that no longer fit."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO tiers(tier, used, capacity) VALUES (?, 0, ?) "
                "ON CONFLICT(tier) DO UPDATE SET capacity=excluded.capacity",
                (tier, capacity),
            )
            return self._evict(db, tier, time.time(), protect=None)

    def usage(self) -> dict[str, tuple[int, int]]:
        """tier -> (used bytes, capacity bytes)."""
        return {t: (u, c) for t, u, c in self._db().execute("SELECT tier, used, capacity FROM tiers")}

    # -- entries -----------------------------------------------------------------------------
    def add(self, ds: str, key: str, tier: str, size: int, crc: int, cost_s: float) -> list[Victim]:
        """Record a cached item; returns what must be evicted from `tier` to make room."""
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT size, crf FROM entries WHERE ds=? AND key=? AND tier=?", (ds, key, tier)
            ).fetchone()
            old_size, crf = (row[0], row[1]) if row else (0, 0.0)
            db.execute(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ds, key, tier, size, crc, cost_s, crf + 1.0, now),
            )
            db.execute("INSERT OR IGNORE INTO tiers(tier, used, capacity) VALUES (?, 0, 0)", (tier,))
            db.execute("UPDATE tiers SET used = used + ? WHERE tier=?", (size - old_size, tier))
            return self._evict(db, tier, now, protect=(ds, key))

    def add_many(self, items: list[tuple[str, str, str, int, int, float]]) -> list[Victim]:
        """Record many cached items (ds, key, tier, size, crc, cost) in one transaction: under many
        concurrent fetchers one commit per batch instead of one per item keeps SQLite's write
        lock from becoming the bottleneck."""
        if not items:
            return []
        now = time.time()
        victims: list[Victim] = []
        with self._tx() as db:
            tiers: set[str] = set()
            for ds, key, tier, size, crc, cost_s in items:
                row = db.execute(
                    "SELECT size, crf FROM entries WHERE ds=? AND key=? AND tier=?", (ds, key, tier)
                ).fetchone()
                old_size, crf = (row[0], row[1]) if row else (0, 0.0)
                db.execute(
                    "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (ds, key, tier, size, crc, cost_s, crf + 1.0, now),
                )
                db.execute("INSERT OR IGNORE INTO tiers(tier, used, capacity) VALUES (?, 0, 0)", (tier,))
                db.execute("UPDATE tiers SET used = used + ? WHERE tier=?", (size - old_size, tier))
                tiers.add(tier)
            for tier in sorted(tiers):
                victims += self._evict(db, tier, now, protect=None)
        return victims

    def _evict(self, db: sqlite3.Connection, tier: str, now: float, protect: tuple[str, str] | None) -> list[Victim]:
        used, cap = db.execute("SELECT used, capacity FROM tiers WHERE tier=?", (tier,)).fetchone()
        if used <= cap:
            return []
        need = used - int(cap * LOW_WATERMARK)
        rows = db.execute("SELECT ds, key, size, cost, crf, last FROM entries WHERE tier=?", (tier,)).fetchall()
        cands = [Entry(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows if (r[0], r[1]) != protect]
        victims = choose_victims(cands, need, now, self.lam)
        db.executemany("DELETE FROM entries WHERE ds=? AND key=? AND tier=?", [(v.ds, v.key, tier) for v in victims])
        db.execute("UPDATE tiers SET used = used - ? WHERE tier=?", (sum(v.size for v in victims), tier))
        return [Victim(v.ds, v.key, tier, v.size) for v in victims]

    def remove(self, ds: str, key: str, tier: str) -> None:
        with self._tx() as db:
            row = db.execute("SELECT size FROM entries WHERE ds=? AND key=? AND tier=?", (ds, key, tier)).fetchone()
            if row:
                db.execute("DELETE FROM entries WHERE ds=? AND key=? AND tier=?", (ds, key, tier))
                db.execute("UPDATE tiers SET used = used - ? WHERE tier=?", (row[0], tier))

    def get(self, ds: str, key: str, tier: str) -> tuple[int, int] | None:
        """(size, crc) of a cached item, or None."""
        row = self._db().execute("SELECT size, crc FROM entries WHERE ds=? AND key=? AND tier=?", (ds, key, tier))
        r = row.fetchone()
        return (r[0], r[1]) if r else None

    def touch(self, ds: str, hits: Iterable[tuple[str, int, float]]) -> None:
        """Fold in-process access counts (key, count, last time) into the shared LRFU values:
        crf <- crf * 2^(-λ (t - last)) + count, in one statement per batch."""
        batch = [(at, count, at, ds, key) for key, count, at in hits]
        if not batch:
            return
        with self._tx() as db:
            db.executemany(
                "UPDATE entries SET crf = crf * sluice_decay(? - last) + ?, last = MAX(last, ?) WHERE ds=? AND key=?",
                batch,
            )

    def entries(self, ds: str | None = None, tier: str | None = None) -> list[tuple[str, str, str, int, int]]:
        """(ds, key, tier, size, crc) rows."""
        q = "SELECT ds, key, tier, size, crc FROM entries WHERE (? IS NULL OR ds=?) AND (? IS NULL OR tier=?)"
        return list(self._db().execute(q, (ds, ds, tier, tier)))

    def drop_dataset(self, ds: str) -> None:
        with self._tx() as db:
            for tier, total in db.execute("SELECT tier, SUM(size) FROM entries WHERE ds=? GROUP BY tier", (ds,)):
                db.execute("UPDATE tiers SET used = used - ? WHERE tier=?", (total, tier))
            db.execute("DELETE FROM entries WHERE ds=?", (ds,))
            db.execute("DELETE FROM datasets WHERE ds=?", (ds,))

    def recount(self) -> None:
        """Recompute tier usage from the entries (after recovery removed some)."""
        with self._tx() as db:
            db.execute("UPDATE tiers SET used = COALESCE((SELECT SUM(size) FROM entries e WHERE e.tier=tiers.tier), 0)")

    # -- datasets ----------------------------------------------------------------------------
    def register(self, ds: str, name: str, source: str, items: int, total: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO datasets VALUES (?, ?, ?, ?, ?)", (ds, name, source, items, total))

    def datasets(self) -> list[tuple[str, str, str, int, int]]:
        return list(self._db().execute("SELECT ds, name, source, items, total FROM datasets"))

    def cached_bytes(self) -> dict[str, int]:
        """ds -> bytes held in any tier, counting an item once even if it is in both tiers."""
        q = "SELECT ds, SUM(size) FROM (SELECT ds, key, MAX(size) AS size FROM entries GROUP BY ds, key) GROUP BY ds"
        return {ds: int(total) for ds, total in self._db().execute(q)}

    def bytes_by_tier(self) -> dict[tuple[str, str], int]:
        """(dataset name, tier) -> bytes held there (metrics: one grouped query, not every entry)."""
        q = "SELECT d.name, e.tier, SUM(e.size) FROM entries e JOIN datasets d ON d.ds = e.ds GROUP BY d.name, e.tier"
        out: dict[tuple[str, str], int] = {}
        for name, tier, total in self._db().execute(q):
            out[(name, tier)] = out.get((name, tier), 0) + int(total)
        return out

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
