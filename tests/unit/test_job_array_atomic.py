"""A job array is made whole or not at all, even when the plane crashes or its store fails
halfway through writing it: each job was written in a transaction of its own, so the jobs
before the failure stayed on disk, Pending, and were admitted and run (after a restart too),
while the user was told the submit failed."""

from __future__ import annotations

import pytest

from sluice.control.failpoints import FailpointCrash

from .test_api import GOOD, Env, env

__all__ = ["env"]


def test_a_crash_halfway_through_an_array_leaves_none_of_its_jobs(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    store = env.plane.store
    real = store._insert_events  # type: ignore[attr-defined]
    calls = []

    def crash_at_the_fourth(conn: object, events: object) -> None:
        calls.append(1)
        if len(calls) == 4:  # the process dies writing the array's fourth job
            raise FailpointCrash("crash")
        real(conn, events)

    monkeypatch.setattr(store, "_insert_events", crash_at_the_fourth)
    with pytest.raises(FailpointCrash):
        _submit(env, 10)
    monkeypatch.undo()
    assert [j.id for j in env.plane.store.list_jobs() if j.spec.array is not None] == []
    assert [j.id for j in env.plane.controller.book.live() if j.spec.array is not None] == []


def test_an_array_is_written_whole(env: Env) -> None:
    _submit(env, 10)
    on_disk = sorted(j.spec.array.index for j in env.plane.store.list_jobs() if j.spec.array is not None)  # type: ignore[union-attr]
    assert on_disk == list(range(10))


def _submit(env: Env, n: int) -> None:
    from sluice.spec import parse_job_spec

    alice = env.plane.store.get_tenant("alice")
    assert alice is not None
    env.plane.submit(alice, parse_job_spec({**GOOD, "array": {"count": n}}))
