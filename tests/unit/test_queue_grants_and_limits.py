"""Queues over the API and the CLI (docs/queues.md): a revoked grant stops admission (running
jobs run on, resume is a 409), lending and borrowing limits that cannot mean anything are
422s naming the field (on create and on the queue a change would leave), the limits shown by
`queue list` / `queue get`, jobs a queue can never admit refused at submit or held saying so,
and a non-preempting priority class saying why it waits. The engine is the FakeEngine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobStarted, Phase
from sluice.model.queue import Limits, QueueConfig
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
from sluice.store import QueueRecord
from sluice.store.sql import SqlStore

from ..live_api import run_cli, serve_for_cli
from .fake_engine import FakeEngine


@dataclass
class Live:
    plane: ControlPlane
    engine: FakeEngine
    url: str
    tokens: dict[str, str]

    def call(self, method: str, path: str, who: str = "admin", body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.request(method, f"{self.url}{path}", json=body, headers=headers)

    def submit(self, who: str, queue: str = "default", cpu: float = 1, replicas: int = 1, **kw: Any) -> httpx.Response:
        res = {"cpu": {"min": cpu}, "replicas": {"min": replicas}}
        spec = {"name": "j", "command": ["python", "t.py"], "queue": queue, "resources": res, **kw}
        return self.call("POST", "/v1/jobs", who, spec)

    def job(self, job_id: str) -> Any:
        return self.plane.controller.book.get(job_id)

    def start(self, job_id: str) -> None:
        job = self.job(job_id)
        self.engine.pending.append(JobStarted(job_id, job.attempt, job.allocation.nodes[0], self.engine.now))
        self.plane.step()
        assert self.job(job_id).phase == Phase.RUNNING


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    home = tmp_path / "home"
    home.mkdir()
    settings = Settings(home=home, preempt_min_runtime_s=0.0)
    engine = FakeEngine()
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    for name in ("alice", "bob"):
        _, tokens[name] = plane.create_tenant(admin, TenantSpec(name=name))
    try:
        with serve_for_cli(plane, home, tokens, monkeypatch) as url:
            yield Live(plane, engine, url, tokens)
    finally:
        plane.store.close()


def sluice(live: Live, who: str, *args: str) -> tuple[int, str, str]:
    import os

    os.environ["SLUICE_TOKEN"] = live.tokens[who]
    try:
        return run_cli(*args)
    finally:
        del os.environ["SLUICE_TOKEN"]


def problems(r: httpx.Response) -> dict[str, str]:
    assert r.status_code == 422, r.text
    return {p["field"]: p["problem"] for p in r.json()["problems"]}


# --------------------------------------------------------------------------- revoking a grant


def test_a_revoked_grant_holds_pending_jobs_keeps_running_ones_and_refuses_resume(live: Live) -> None:
    assert live.call("POST", "/v1/queues", body={"name": "research", "nominal": {"cores": 4}}).status_code == 201
    assert live.call("POST", "/v1/queues/research/grants", body={"tenant": "alice"}).status_code == 200
    ids = [live.submit("alice", "research").json()["id"] for _ in range(2)]
    live.plane.step()
    live.start(ids[0])
    live.start(ids[1])
    live.call("POST", f"/v1/jobs/{ids[1]}/suspend", "alice")
    later = live.submit("alice", "research", cpu=1).json()["id"]

    code, _, err = sluice(live, "admin", "queue", "grant", "research", "alice", "--revoke")
    assert code == 0, err
    live.plane.step()
    waiting = live.job(later)
    assert waiting.phase == Phase.PENDING
    assert waiting.reason.startswith("queue research is no longer granted to tenant alice")
    assert live.job(ids[0]).phase == Phase.RUNNING  # running jobs run on

    # The suspended job finishes stopping, then resuming it is refused, saying why.
    attempt = live.job(ids[1]).attempt
    live.engine.pending.append(JobExited(ids[1], attempt, live.engine.now, -15))
    live.plane.step()
    assert live.job(ids[1]).phase == Phase.SUSPENDED
    r = live.call("POST", f"/v1/jobs/{ids[1]}/resume", "alice")
    assert r.status_code == 409 and "queue research is no longer granted to tenant alice" in r.text
    code, _, err = sluice(live, "alice", "job", "resume", ids[1])
    assert code == 1 and "stays Suspended" in err and "no longer granted" in err
    assert live.job(ids[1]).phase == Phase.SUSPENDED

    # Granted again: the waiting job is admitted and the suspended one may resume.
    live.call("POST", "/v1/queues/research/grants", body={"tenant": "alice"})
    live.plane.step()
    assert live.job(later).phase != Phase.PENDING
    assert live.call("POST", f"/v1/jobs/{ids[1]}/resume", "alice").status_code == 200


def test_a_tenant_sees_its_grant_of_a_shared_queue_never_who_else_shares_it(live: Live) -> None:
    """A queue granted to alice and bob listed both names to each (new-user walk s30): tenants
    are mutually untrusted, and who else runs in a queue is not theirs to learn. Each sees
    itself; an admin sees both; the usage and backlog, which admission judges by, stay whole."""
    live.call("POST", "/v1/queues", body={"name": "shared", "nominal": {"cores": 4}})
    for who in ("alice", "bob"):
        assert live.call("POST", "/v1/queues/shared/grants", body={"tenant": who}).status_code == 200
    assert live.submit("bob", queue="shared").status_code == 201
    live.plane.step()

    def shared(who: str) -> dict[str, Any]:
        items = live.call("GET", "/v1/queues", who).json()["items"]
        return next(q for q in items if q["name"] == "shared")

    assert shared("admin")["tenants"] == ["alice", "bob"]
    assert shared("alice")["tenants"] == ["alice"] and shared("bob")["tenants"] == ["bob"]
    assert shared("alice")["admitted"] + shared("alice")["pending"] == 1  # bob's job counts, unnamed
    default = next(q for q in live.call("GET", "/v1/queues", "alice").json()["items"] if q["name"] == "default")
    assert default["tenants"] is None  # everyone's
    code, out, _ = sluice(live, "alice", "queue", "get", "shared")
    assert code == 0 and "bob" not in out


def test_the_default_queue_needs_no_grant(live: Live) -> None:
    job_id = live.submit("bob").json()["id"]
    live.plane.step()
    assert live.job(job_id).phase != Phase.PENDING


# --------------------------------------------------------------------------- lending and borrowing limits


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            {"name": "q", "cohort": "lab", "nominal": {"cores": 1}, "lending_limit": {"cores": 5}},
            "lending_limit.cores",
            "5 is more than queue q's nominal cores quota (1)",
        ),
        (
            {"name": "q", "cohort": "lab", "nominal": {"cores": 1}, "lending_limit": {"gpus": 1}},
            "lending_limit.gpus",
            "no nominal gpus quota",
        ),
        (
            {"name": "q", "nominal": {"cores": 1}, "borrowing_limit": {"cores": 5}},
            "borrowing_limit.cores",
            "in no cohort, so it can never borrow",
        ),
        (  # accepted and shown, though it lent to no one (walk5)
            {"name": "q", "nominal": {"cores": 2}, "lending_limit": {"cores": 1}},
            "lending_limit.cores",
            "in no cohort, so it lends to no one",
        ),
        (
            {"name": "q", "cohort": "lab", "nominal": {"cores": 1}, "borrowing_limit": {"gpus": 2}},
            "borrowing_limit.gpus",
            "no nominal gpus quota",
        ),
    ],
)
def test_limits_that_cannot_mean_anything_are_422s_naming_the_field(
    live: Live, body: dict[str, Any], field: str, words: str
) -> None:
    got = problems(live.call("POST", "/v1/queues", body=body))
    assert words in got[field], got
    assert live.call("GET", "/v1/queues").json()["items"][-1]["name"] != "q"  # nothing was created


def test_sensible_limits_are_accepted_and_a_borrowing_limit_of_0_anywhere() -> None:
    from sluice.control.queues import limit_problems

    assert limit_problems(QueueConfig("q", "lab", Limits(cores=2), Limits(cores=4), Limits(cores=2))) == []
    assert limit_problems(QueueConfig("q", None, Limits(cores=2), Limits(cores=0))) == []
    assert limit_problems(QueueConfig("q", None, Limits(cores=2), lending_limit=Limits(cores=0))) == []


def test_queue_set_checks_the_queue_it_would_leave(live: Live) -> None:
    live.call("POST", "/v1/queues", body={"name": "ml", "cohort": "lab", "nominal": {"cores": 1}})
    code, _, err = sluice(live, "admin", "queue", "set", "ml", "--lend-cores", "5")
    assert code == 2 and "--lend-cores: 5 is" in err and "more than queue ml's nominal cores quota (1)" in err
    r = live.call("PATCH", "/v1/queues/ml", body={"borrowing_limit": {"cores": 1}})
    assert r.status_code == 200
    # Out of the cohort, the borrowing limit could never be used: say so, and how to clear it.
    got = problems(live.call("PATCH", "/v1/queues/ml", body={"cohort": ""}))
    assert "in no cohort, so it can never borrow" in got["borrowing_limit.cores"]
    code, _, err = sluice(live, "admin", "queue", "set", "ml", "--cohort", "", "--borrow-cores", "0")
    assert code == 0, err
    # A lending limit likewise: out of the cohort it lends to no one; 0 clears it.
    live.call("PATCH", "/v1/queues/ml", body={"cohort": "lab", "lending_limit": {"cores": 1}})
    got = problems(live.call("PATCH", "/v1/queues/ml", body={"cohort": ""}))
    assert "in no cohort, so it lends to no one" in got["lending_limit.cores"]
    code, _, err = sluice(live, "admin", "queue", "set", "ml", "--cohort", "", "--lend-cores", "0")
    assert code == 0, err
    # Lowering the nominal quota under the lending limit is refused too.
    live.call("PATCH", "/v1/queues/ml", body={"cohort": "lab", "nominal": {"cores": 4}, "lending_limit": {"cores": 3}})
    got = problems(live.call("PATCH", "/v1/queues/ml", body={"nominal": {"cores": 2}}))
    assert "lending_limit.cores" in got
    q = live.call("GET", "/v1/queues").json()["items"]
    assert [x["nominal"] for x in q if x["name"] == "ml"] == [{"cores": 4.0}]  # nothing changed


def test_a_queue_stored_with_a_senseless_limit_can_still_be_changed(live: Live) -> None:
    """Queues accepted before these checks are not locked: a change that adds no new problem passes."""
    live.plane.store.save_queue(QueueRecord(QueueConfig("old", None, Limits(cores=1), Limits(cores=3)), 0.0))
    assert live.call("PATCH", "/v1/queues/old", body={"weight": 2}).status_code == 200
    assert "lending_limit.cores" in problems(live.call("PATCH", "/v1/queues/old", body={"lending_limit": {"cores": 9}}))


def test_queue_list_and_get_show_the_limits(live: Live) -> None:
    body = {
        "name": "research",
        "cohort": "lab",
        "nominal": {"cores": 8},
        "borrowing_limit": {"cores": 4},
        "lending_limit": {"cores": 2},
    }
    r = live.call("POST", "/v1/queues", body=body)
    assert r.json()["summary"] == "cores 0/8 nominal (+4 borrowable, lends at most 2); cohort lab"
    code, out, err = sluice(live, "admin", "queue", "list")
    assert code == 0, err
    assert "LIMITS" in out and "borrow cores=4; lend cores=2" in out
    code, out, err = sluice(live, "admin", "queue", "get", "research")
    assert code == 0, err
    assert "borrowing limit: cores=4" in out and "lending limit:   cores=2" in out
    code, out, _ = sluice(live, "admin", "queue", "get", "research", "-o", "json")
    assert json.loads(out)["lending_limit"] == {"cores": 2.0}
    # A tenant not granted it reads it as missing, like the API's 422 at submit.
    code, _, err = sluice(live, "alice", "queue", "get", "research")
    assert code == 1 and "queue 'research' not found" in err


# --------------------------------------------------------------------------- jobs a queue can never admit


def test_a_job_its_queue_can_never_admit_is_a_422_naming_the_resource(live: Live) -> None:
    live.call("POST", "/v1/queues", body={"name": "tiny", "nominal": {"cores": 0.5}})
    live.call("POST", "/v1/queues", body={"name": "none", "nominal": {"jobs": 0}})
    body = {"name": "capped", "cohort": "lab", "nominal": {"cores": 1}, "borrowing_limit": {"cores": 1}}
    live.call("POST", "/v1/queues", body=body)
    for q in ("tiny", "none", "capped"):
        live.call("POST", f"/v1/queues/{q}/grants", body={"tenant": "alice"})
    got = problems(live.submit("alice", "tiny", cpu=1))
    assert got["resources.cpu.min"] == (
        "the job needs 1 cores, but queue tiny can never give it more than 0.5 (cores 0.5 nominal, in no cohort)"
    )
    got = problems(live.submit("alice", "none", cpu=0.5))
    assert got["queue"] == "queue none can never admit a job: its quota is jobs 0 nominal, in no cohort"
    got = problems(live.submit("alice", "capped", cpu=1, replicas=3))
    assert got["resources.cpu.min"] == (
        "the job needs 3 cores (1 x 3 replicas), but queue capped can never give it more than 2 "
        "(cores 1 nominal + borrowing limit 1)"
    )
    assert live.submit("alice", "capped", cpu=1, replicas=2).status_code == 201  # 2 may fit, one day


def test_a_job_held_back_by_what_its_cohort_lends_or_a_lowered_quota_says_it_can_never_be_admitted(
    live: Live,
) -> None:
    live.call("POST", "/v1/queues", body={"name": "research", "cohort": "lab", "nominal": {"cores": 1}})
    live.call("POST", "/v1/queues", body={"name": "ml", "cohort": "lab", "nominal": {"cores": 1}})
    live.call("POST", "/v1/queues/research/grants", body={"tenant": "alice"})
    r = live.submit("alice", "research", cpu=1, replicas=3)  # 3 > 1 + the 1 ml lends
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    live.plane.step()
    assert live.job(job_id).reason == (
        "queue research: can never be admitted while queue research's quota is cores 1 nominal + at most 1 "
        "that cohort lab lends: it needs 3 cores; an admin may raise the quota (sluice queue set), or cancel the job"
    )
    live.call("PATCH", "/v1/queues/ml", body={"nominal": {"cores": 2}})
    live.plane.step()
    assert live.job(job_id).phase != Phase.PENDING  # the quota changed: it fits now


# --------------------------------------------------------------------------- classes that never preempt


def test_a_job_of_a_class_that_never_preempts_says_so_while_it_waits(live: Live) -> None:
    live.call("POST", "/v1/priority-classes", body={"name": "polite", "value": 200, "preemption": "never"})
    low = [live.submit("alice", cpu=2).json()["id"] for _ in range(2)]  # fill both 2-core nodes
    live.plane.step()
    for job_id in low:
        live.start(job_id)
    polite = live.submit("bob", cpu=2, priority_class="polite").json()["id"]
    live.plane.step()
    live.plane.step()
    job = live.job(polite)
    assert job.phase == Phase.QUEUED and not live.engine.stopped
    assert job.reason.endswith(
        "; its priority class does not preempt (preemption: never): it waits for room rather than preempting "
        "1 lower-priority job(s) of queue default"
    )


# --------------------------------------------------------------------------- a queue's time limit


def test_a_queue_time_limit_is_given_to_its_jobs_and_refuses_longer_ones(live: Live) -> None:
    """Slurm's partition MaxTime: a job without max_runtime_s gets the queue's, one asking for
    more is a 422 naming max_runtime_s, and a limit changed live holds running jobs too."""
    assert live.call("POST", "/v1/queues", body={"name": "short", "max_runtime_s": 10}).status_code == 201
    assert live.call("POST", "/v1/queues/short/grants", body={"tenant": "alice"}).status_code == 200
    assert "max_runtime_s" in problems(live.submit("alice", "short", max_runtime_s=11))
    within = live.submit("alice", "short", max_runtime_s=10)
    assert within.status_code == 201, within.text
    plain = live.submit("alice", "short").json()["id"]
    other = live.submit("alice").json()["id"]  # the default queue: no limit
    # Each job's view says how long it may run and whose limit that is (the smaller one).
    views = {j["id"]: j for j in live.call("GET", "/v1/jobs", "alice").json()["items"]}
    assert (views[plain]["time_limit_s"], views[plain]["time_limit_of"]) == (10, "queue")
    assert (views[within.json()["id"]]["time_limit_s"], views[within.json()["id"]]["time_limit_of"]) == (10, "job")
    assert (views[other]["time_limit_s"], views[other]["time_limit_of"]) == (None, None)
    assert live.call("GET", f"/v1/jobs/{plain}", "alice").json()["time_limit_of"] == "queue"
    code, out, err = sluice(live, "alice", "job", "get", plain)
    assert code == 0 and "0s of 10s (queue short's max_runtime_s)" in out, out + err
    code, out, err = sluice(live, "alice", "job", "get", within.json()["id"])
    assert code == 0 and "0s of 10s (its max_runtime_s)" in out, out + err
    live.plane.step()
    for job_id in (within.json()["id"], plain, other):
        live.start(job_id)
    for _ in range(10):
        live.engine.now += 1
        live.plane.step()
    held = live.job(plain)
    assert held.phase == Phase.STOPPING and held.reason.endswith("past queue short's max_runtime_s of 10s")
    assert live.job(within.json()["id"]).phase == Phase.STOPPING
    assert live.job(other).phase == Phase.RUNNING

    r = live.call("PATCH", "/v1/queues/default", body={"max_runtime_s": 5})
    assert r.status_code == 200 and r.json()["max_runtime_s"] == 5
    live.plane.step()
    assert live.job(other).phase == Phase.STOPPING  # 11 s run: held to the new limit at once
    r = live.call("PATCH", "/v1/queues/default", body={"max_runtime_s": None})
    assert r.status_code == 200 and r.json()["max_runtime_s"] is None
    for bad in (0, -5, 1e12, "x"):
        assert live.call("PATCH", "/v1/queues/short", body={"max_runtime_s": bad}).status_code == 422
    assert live.call("PATCH", "/v1/queues/short", "alice", {"max_runtime_s": None}).status_code == 403


def test_queue_time_limit_on_the_cli(live: Live) -> None:
    code, _, err = sluice(live, "admin", "queue", "create", "short", "--max-runtime-s", "3600")
    assert code == 0, err
    code, out, _ = sluice(live, "admin", "queue", "get", "short")
    assert code == 0 and "3600s" in out
    code, out, _ = sluice(live, "admin", "queue", "set", "short", "--max-runtime-s", "none", "-o", "json")
    assert code == 0 and json.loads(out)["max_runtime_s"] is None
    code, _, err = sluice(live, "admin", "queue", "set", "short", "--max-runtime-s", "1h")
    assert code == 2 and "--max-runtime-s" in err


def test_a_queue_deleted_while_a_submit_is_on_its_way_gets_no_job(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue is checked at submit, outside the controller's lock; its delete checks for
    jobs under the lock. A delete in between left a job in a queue that no longer existed,
    Pending for ever ("queue q does not exist"). The check is made again where the job is."""
    assert live.call("POST", "/v1/queues", body={"name": "q", "nominal": {"cores": 2}}).status_code == 201
    assert live.call("POST", "/v1/queues/q/grants", body={"tenant": "alice"}).status_code == 200
    checked = live.plane.queues.check_submit

    def then_deleted(tenant: str, spec: Any) -> None:
        checked(tenant, spec)
        assert live.call("DELETE", "/v1/queues/q").status_code == 204  # nothing of q's yet

    monkeypatch.setattr(live.plane.queues, "check_submit", then_deleted)
    res = live.submit("alice", queue="q")
    assert res.status_code == 422, res.text
    assert res.json()["problems"][0]["field"] == "queue"
    assert not [j for j in live.plane.controller.book.live() if j.spec.queue == "q"]


def test_a_queue_with_unfinished_jobs_is_not_deleted_and_the_409_names_them(live: Live) -> None:
    """Its 409 said only how many jobs were left ("still has 2 unfinished job(s)"): which ones,
    and that a suspended job counts, is what an admin needs to go on (as `tenant delete` says)."""
    assert live.call("POST", "/v1/queues", body={"name": "q", "nominal": {"cores": 1}}).status_code == 201
    assert live.call("POST", "/v1/queues/q/grants", body={"tenant": "alice"}).status_code == 200
    waiting, parked = (live.submit("alice", queue="q").json()["id"] for _ in range(2))
    assert live.call("POST", f"/v1/jobs/{parked}/suspend", "alice").status_code == 200
    live.plane.step()
    assert live.job(parked).phase == Phase.SUSPENDED
    res = live.call("DELETE", "/v1/queues/q")
    assert res.status_code == 409, res.text
    detail = res.json()["detail"]
    assert "2 unfinished job(s): " in detail and "suspended job counts" in detail
    assert waiting in detail and parked in detail
    assert [q["name"] for q in live.call("GET", "/v1/queues").json()["items"]] == ["default", "q"]
