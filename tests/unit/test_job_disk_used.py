"""What a job's run folders hold (JobUsage.disk_mb, from the node's disk watch) reaches its
record (`disk_mb`), the API and `job get`: the newest attempt's only, a gang's summed over its
replicas, and an ended job keeps its last (FakeEngine; the real walk is in
tests/integration/test_disk_limits.py)."""

from __future__ import annotations

import pytest

from sluice.api.schemas import JobOut
from sluice.cli.job import _cpu_used, _disk
from sluice.control.controller import Controller
from sluice.engine.ray_gang import GangBook
from sluice.model import JobExited, JobUsage, Phase
from sluice.store import MemoryStore

from .fake_engine import FakeEngine
from .scripted_policy import Scripted
from .test_controller import spec, start


def _usage(ctl: Controller, engine: FakeEngine, job_id: str, disk_mb: float | None, attempt: int | None = None) -> None:
    attempt = ctl.book.get(job_id).attempt if attempt is None else attempt  # type: ignore[union-attr]
    engine.now += 1
    engine.pending.append(JobUsage(job_id, attempt, engine.now, 1.0, cpu_s=engine.now, disk_mb=disk_mb))
    ctl.step()


def test_the_newest_check_of_the_newest_attempt_is_kept_and_outlives_the_job() -> None:
    store, engine = MemoryStore(), FakeEngine()
    ctl = Controller(store, engine, Scripted(), checkpoint_root="/ckpt", restart_backoff_s=0.0)
    job = ctl.submit("alice", spec())
    start(ctl, engine, job.id)
    assert ctl.book.get(job.id).disk_mb is None  # type: ignore[union-attr]
    _usage(ctl, engine, job.id, 3.5)
    _usage(ctl, engine, job.id, None)  # a sample with no check since: the last stays
    assert ctl.book.get(job.id).disk_mb == 3.5  # type: ignore[union-attr]
    _usage(ctl, engine, job.id, 900.0, attempt=0)  # an older attempt's: ignored
    _usage(ctl, engine, job.id, 2.0)  # it removed files: down too
    assert ctl.book.get(job.id).disk_mb == 2.0  # type: ignore[union-attr]
    engine.pending.append(JobExited(job.id, 1, engine.now, 0))
    ctl.step()
    ended = store.get_job(job.id)
    assert ended is not None and ended.phase == Phase.SUCCEEDED and ended.disk_mb == 2.0
    assert JobOut.of(ended, "alice").disk_mb == 2.0


def test_a_gangs_disk_is_every_replicas() -> None:
    book = GangBook()
    rid = dict(enumerate(r for r, _ in book.open("j", 1, ["n0", "n1", "n2"])))
    assert book.translate(JobUsage(rid[1], 1, 1.0, 1.0, cpu_s=1.0, disk_mb=10.0), "n1") == ([], [])
    book.translate(JobUsage(rid[2], 1, 1.0, 1.0, cpu_s=1.0, disk_mb=5.0), "n2")
    book.translate(JobUsage(rid[2], 1, 1.5, 1.0, cpu_s=1.0, disk_mb=4.0), "n2")  # its newest, not its most
    [usage], _ = book.translate(JobUsage(rid[0], 1, 2.0, 1.0, cpu_s=1.0, disk_mb=1.0), "n0")
    assert usage.job_id == "j" and usage.disk_mb == pytest.approx(15.0) and usage.cpu_s == pytest.approx(3.0)
    # a replica measured with no CPU counter still speaks for the gang's disk
    [again], _ = book.translate(JobUsage(rid[0], 1, 3.0, 1.0, disk_mb=2.0), "n0")
    assert again.disk_mb == pytest.approx(16.0) and again.cpu_s is None


def test_job_get_shows_it_against_the_jobs_limit() -> None:
    job = {"phase": "Running", "disk_mb": 12.25, "spec": {"resources": {"disk_mb": 50}}}
    assert _disk(job) == "12.2 MiB (limit 50 MiB, 24 %)"
    assert _disk({**job, "disk_mb": None}) == "not measured yet (limit 50 MiB)"
    assert _disk({**job, "spec": {"resources": {}}}) == "12.2 MiB"


def test_job_get_shows_a_short_jobs_cpu_in_more_than_whole_seconds() -> None:
    """A job that held 0.43 core-s read "47 % of the 0 core-s held"."""
    job = {"cpu_used_s": 0.2, "attained_service": 0.43, "spec": {"resources": {}}}
    assert _cpu_used(job) == "0.2 core-s (47 % of the 0.43 core-s held)"
    assert (
        _cpu_used({**job, "cpu_used_s": 812.4, "attained_service": 933.0}) == "812 core-s (87 % of the 933 core-s held)"
    )
    assert _cpu_used({**job, "cpu_used_s": 0.0}) == "0 core-s (0 % of the 0.43 core-s held)"


def test_a_gangs_sum_is_not_held_against_one_replicas_limit() -> None:
    """resources.disk_mb bounds each replica's folder on its own; a gang's disk is every
    replica's summed: 4 replicas of 30 MiB under a 50 MiB bound read '240 %', past a limit no
    replica was near."""
    gang = {"phase": "Running", "disk_mb": 120.0, "spec": {"resources": {"disk_mb": 50, "replicas": {"min": 4}}}}
    assert _disk(gang) == "120.0 MiB (limit 50 MiB a replica)"
    elastic = {**gang, "spec": {"resources": {"disk_mb": 50, "replicas": {"min": 1, "max": 3}}}}
    assert _disk(elastic) == "120.0 MiB (limit 50 MiB a replica)"
    one = {**gang, "disk_mb": 12.25, "spec": {"resources": {"disk_mb": 50, "replicas": {"min": 1}}}}
    assert _disk(one) == "12.2 MiB (limit 50 MiB, 24 %)"
