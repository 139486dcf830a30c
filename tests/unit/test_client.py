"""sluice.client against the real API on a loopback port (uvicorn in a thread, the real
ControlPlane over SqlStore, the FakeEngine): typed answers, every page, the error classes
and the server's words in them, and the defaults the CLI shares (server.json, token files)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import sluice.client.api as client_api
from sluice.client import (
    BadRequestError,
    Client,
    ConflictError,
    ForbiddenError,
    JobOut,
    NotFoundError,
    ProtocolError,
    SluiceError,
    UnauthorizedError,
    UnreachableError,
    WaitTimeout,
)
from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobProgress, JobStarted, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import JobSpec, TenantSpec
from sluice.store.sql import SqlStore

from ..live_api import free_port, run_cli, serve_for_cli
from .fake_engine import FakeEngine


@dataclass
class LogFakeEngine(FakeEngine):
    log_dir: Path = Path("/nonexistent")

    def log_path(self, job_id: str) -> str | None:
        return str(self.log_dir / f"{job_id}.log")


@dataclass
class Live:
    plane: ControlPlane
    engine: LogFakeEngine
    home: Path
    url: str
    tokens: dict[str, str]


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    home = tmp_path / "home"
    settings = Settings(home=home, dataset_roots=[str(tmp_path)])
    home.mkdir()
    engine = LogFakeEngine(log_dir=tmp_path)
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    _, tokens["bob"] = plane.create_tenant(plane.authenticate(tokens["admin"]), TenantSpec(name="bob"))
    try:
        with serve_for_cli(plane, home, tokens, monkeypatch) as url:
            yield Live(plane, engine, home, url, tokens)
    finally:
        plane.store.close()


SPEC = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 2}}}


def _started(live: Live, c: Client) -> JobOut:
    job = c.submit(SPEC)
    live.plane.step()
    attempt = live.plane.controller.book.get(job.id).attempt
    live.engine.pending.append(JobStarted(job.id, attempt, "n0", live.engine.now))
    live.plane.step()
    return c.job(job.id)


def _exit(live: Live, job_id: str, code: int = 0) -> None:
    attempt = live.plane.controller.book.get(job_id).attempt
    live.engine.pending.append(JobExited(job_id, attempt, live.engine.now, code))
    live.plane.step()


def test_a_resume_waits_for_the_checkpoint_copy_past_the_usual_timeout(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server copies the old job's checkpoints before answering (up to 64 GiB by default);
    the client gave up after its usual timeout while the server went on and made the job, so
    the user's retry made a second one."""
    import time

    import sluice.control.plane as plane_module

    def slow_copy(*args: object, **kwargs: object) -> tuple[str, int]:
        time.sleep(1.5)  # a big checkpoint
        return "/checkpoints/ckpt-5.pt", 5

    monkeypatch.setattr(plane_module, "copy_checkpoints", slow_copy)
    with Client(timeout_s=0.5) as c:
        old = _started(live, c)
        _exit(live, old.id)
        new = c.submit(SPEC, resume_from=old.id)
        assert sorted(j.id for j in c.jobs()) == sorted([old.id, new.id])  # one new job, no second
        assert any("starts from job" in e.message for e in c.why(new.id))


def test_defaults_are_the_clis_server_json_and_token_files(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    with Client() as c:
        assert c.url == live.url
        assert [j.id for j in c.jobs()] == []
    with Client(admin=True) as c:  # admin.token first
        assert {t.name for t in c.tenants()} == {"admin", "bob", "default"}
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    with Client() as c:
        assert c.submit(SPEC).tenant == "bob"
    monkeypatch.setenv("SLUICE_URL", "http://127.0.0.1:1/")
    with Client() as c:
        assert c.url == "http://127.0.0.1:1"
    with Client(url=live.url, token=live.tokens["default"]) as c:  # explicit arguments win over the environment
        assert c.jobs() == []  # bob's job is not the default tenant's


def test_submit_from_dict_yaml_and_model_then_get_list_why(live: Live, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: yaml-job\ncommand: [python, train.py]\n")
    with Client() as c:
        a = c.submit(SPEC)
        b = c.submit(path)
        m = c.submit(JobSpec.model_validate({**SPEC, "name": "model-job"}))
        assert isinstance(a, JobOut) and a.phase == "Pending" and a.tenant == "default"
        assert b.name == "yaml-job" and b.spec["workdir"] == str(tmp_path)  # the file's folder
        assert [j.id for j in c.jobs()] == sorted([a.id, b.id, m.id])  # one fake clock: by id
        live.plane.step()
        assert c.job(a.id).phase == "Starting"
        assert {j.id for j in c.jobs(phase=["starting"])} == {a.id, b.id, m.id}
        assert c.jobs(phase=Phase.RUNNING) == []
        assert c.jobs(tenant="bob") == [] and c.jobs(queue="default") == [
            j for j in c.jobs() if j.spec.get("queue") == "default"
        ]
        events = c.why(a.id)
        assert events[0].kind == "phase" and "submitted by tenant default" in events[0].message
        assert c.explain(a.id) == events
        with pytest.raises(BadRequestError, match="phase"):
            c.jobs(phase="sleeping")


def test_a_priority_class_from_a_file_and_the_default_class_apply_to_client_submissions(
    live: Live, tmp_path: Path
) -> None:
    with Client(admin=True) as admin:
        admin.create_priority_class({"name": "high", "value": 100})
        admin.create_priority_class({"name": "batch", "value": -5, "default": True})
    path = tmp_path / "job.yaml"
    path.write_text("name: urgent\ncommand: [python, train.py]\npriority_class: high\n")
    with Client() as c:
        urgent = c.submit(path)  # was 422: the client sent the default `priority: 0` as if set
        assert (urgent.spec["priority"], urgent.spec["priority_class"]) == (100, "high")
        plain = c.submit(SPEC)  # sets neither: the default class
        assert (plain.spec["priority"], plain.spec["priority_class"]) == (-5, "batch")
        bare = c.submit({**SPEC, "priority": 0})  # an explicit integer is kept
        assert (bare.spec["priority"], bare.spec["priority_class"]) == (0, None)


def test_request_bodies_hold_only_the_fields_given() -> None:
    bodies: list[tuple[str, dict[str, object]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append((request.url.path, json.loads(request.content)))
        return httpx.Response(500, json={"error": "error", "detail": "stop here"})

    with Client("http://sluice.test", "t", transport=httpx.MockTransport(handler)) as c:
        calls = [
            lambda: c.submit({"command": ["x"], "priority_class": "high", "resources": {"cpu": 2}}),
            lambda: c.submit({"command": ["x"], "priority_class": "high"}, resume_from="j-1"),
            lambda: c.create_tenant({"name": "carol"}),
            lambda: c.create_queue({"name": "q", "nominal": {"cores": 2}}),
            lambda: c.create_priority_class({"name": "high", "value": 100}),
            lambda: c.create_dataset({"name": "d", "source": "/data"}),
        ]
        for call in calls:
            with pytest.raises(SluiceError):
                call()
    assert bodies == [
        ("/v1/jobs", {"command": ["x"], "priority_class": "high", "resources": {"cpu": {"min": 2.0}}}),
        ("/v1/jobs", {"command": ["x"], "priority_class": "high", "resume_from": "j-1"}),
        ("/v1/tenants", {"name": "carol"}),
        ("/v1/queues", {"name": "q", "nominal": {"cores": 2.0}}),
        ("/v1/priority-classes", {"name": "high", "value": 100}),
        ("/v1/datasets", {"name": "d", "source": "/data"}),
    ]


def test_every_page_is_walked(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_api, "PAGE_SIZE", 2)
    seen: list[str] = []
    with Client() as c:
        ids = [c.submit(SPEC).id for _ in range(5)]
        real = c.request

        def counting(method: str, path: str, **kw: object) -> object:
            seen.append(path)
            return real(method, path, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(c, "request", counting)
        assert [j.id for j in c.jobs()] == sorted(ids)
    assert seen == ["/v1/jobs"] * 3  # 2 + 2 + 1


def test_a_repeated_cursor_or_a_non_page_is_a_protocol_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs":
            return httpx.Response(200, json={"items": [], "next_cursor": "same"})
        return httpx.Response(200, json=[1, 2])

    with Client("http://sluice.test", "t", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ProtocolError, match="repeated a page cursor"):
            c.jobs()
        with pytest.raises(ProtocolError, match="not a list page"):
            c.tenants()


def test_errors_carry_the_status_and_the_servers_words(live: Live, tmp_path: Path) -> None:
    with Client() as c:
        job = c.submit(SPEC)
        with pytest.raises(NotFoundError) as nf:
            c.job("nope")
        assert nf.value.status == 404 and str(nf.value) == "job nope not found"
        with pytest.raises(ForbiddenError) as fb:
            c.tenants()  # the default tenant is no admin
        assert fb.value.status == 403
        with pytest.raises(BadRequestError) as br:  # the server's 422, naming the parameter
            c.logs(job.id, tail=0)
        assert br.value.status == 422 and [p.field for p in br.value.problems] == ["tail"]
        assert "tail:" in str(br.value)
        with pytest.raises(BadRequestError) as local:  # checked here before any request
            c.submit({"name": "x", "resources": {"cpu": -1}})
        assert {p.field for p in local.value.problems} >= {"command", "resources.cpu.min"}
    with Client(admin=True) as admin:
        with pytest.raises(ConflictError, match="already exists") as cf:
            admin.create_tenant({"name": "bob"})
        assert cf.value.status == 409
    with Client(token="slc_not-a-token") as stranger, pytest.raises(UnauthorizedError) as ua:
        stranger.jobs()
    assert ua.value.status == 401
    with Client(token=live.tokens["bob"]) as bob, pytest.raises(NotFoundError, match=f"job {job.id} not found"):
        bob.cancel(job.id)  # another tenant's job does not exist for bob
    with Client(f"http://127.0.0.1:{free_port()}", "t") as down, pytest.raises(UnreachableError) as ur:
        down.jobs()
    assert ur.value.status is None and "cannot reach the sluice server" in str(ur.value)
    assert all(
        issubclass(e, SluiceError)
        for e in (NotFoundError, ForbiddenError, ConflictError, BadRequestError, UnreachableError)
    )


def test_logs_progress_wait_and_cancel(live: Live, tmp_path: Path) -> None:
    with Client() as c:
        job = _started(live, c)
        assert job.phase == "Running" and c.progress(job.id) is None  # no report yet
        (tmp_path / f"{job.id}.log").write_text("step 1 loss 2.0\nstep 2 loss 1.5\n")
        assert c.logs(job.id) == "step 1 loss 2.0\nstep 2 loss 1.5\n"
        assert c.logs(job.id, tail=1) == "step 2 loss 1.5\n"
        with pytest.raises(WaitTimeout) as wt:
            c.wait(job.id, timeout_s=0.2, poll_s=0.05)
        assert wt.value.job.phase == "Running" and isinstance(wt.value, TimeoutError)

        attempt = live.plane.controller.book.get(job.id).attempt
        live.engine.pending.append(JobProgress(job.id, attempt, live.engine.now + 1, step=10, loss=2.0))
        live.plane.step()
        records = []
        for p in c.follow_progress(job.id, poll_s=0.01):
            records.append(p)
            if len(records) == 1:  # the follower is paused here: report more
                live.engine.pending.append(JobProgress(job.id, attempt, live.engine.now + 2, step=20, loss=1.0))
                live.plane.step()
            else:  # then end the job: the follower stops
                _exit(live, job.id)
        assert [r.step for r in records] == [10, 20] and records[-1].loss == 1.0

        assert list(c.follow_logs(job.id)) == ["step 1 loss 2.0", "step 2 loss 1.5"]
        assert "".join(c.follow_logs(job.id, raw=True)) == "step 1 loss 2.0\nstep 2 loss 1.5\n"
        done = c.wait(job.id, timeout_s=5)
        assert done.phase == "Succeeded" and done.exit_code == 0

        other = c.submit(SPEC)
        assert c.cancel(other.id).phase == "Cancelled"
        with pytest.raises(ConflictError):
            c.suspend(other.id)


def test_datasets_tenants_queues_nodes(live: Live, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 100)
    with Client(admin=True) as admin:
        carol = admin.create_tenant({"name": "carol", "max_running_jobs": 2})
        assert carol.token.startswith("slc_")
        assert admin.update_tenant("carol", {"weight": 2}).weight == 2
        assert [t.name for t in admin.tenants()] == ["admin", "bob", "carol", "default"]
        admin.delete_tenant("carol")
        with pytest.raises(NotFoundError):
            admin.delete_tenant("carol")

        q = admin.create_queue({"name": "research", "nominal": {"cores": 2}})
        assert q.name == "research" and q.nominal.get("cores") == 2
        assert admin.grant_queue("research", "bob").tenants == ["bob"]
        assert "research" in [x.name for x in admin.queues()]
        admin.delete_queue("research")

        assert [n.name for n in admin.nodes()] == ["n0", "n1"]
        assert admin.cordon("n0", "disk failing").health == "Cordoned"
        assert admin.uncordon("n0").health == "Healthy"

    with Client() as c:
        ds = c.create_dataset({"name": "digits", "source": str(data)})
        assert ds.name == "digits" and ds.items == 1 and ds.total_bytes == 100
        assert [d.name for d in c.datasets()] == ["digits"]
        assert c.dataset("digits").source == str(data)
        assert c.delete_dataset("digits").name == "digits"
        with pytest.raises(NotFoundError):
            c.dataset("digits")
        with pytest.raises(BadRequestError) as bad:
            c.create_dataset({"name": "x"})
        assert "source" in {p.field for p in bad.value.problems}


def test_an_error_body_that_is_not_json_still_reads() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="Bad Gateway from a proxy")

    with (
        Client("http://sluice.test", "t", transport=httpx.MockTransport(handler)) as c,
        pytest.raises(SluiceError) as e,
    ):
        c.job("x")
    assert e.value.status == 502 and "Bad Gateway from a proxy" in str(e.value)
    assert json.loads(json.dumps(e.value.detail)) == "Bad Gateway from a proxy"


def test_ids_and_names_are_one_path_segment_each() -> None:
    """An id is percent-encoded as one segment: `?`, `#`, `%`, `..` in it never retarget the
    request to another job, another endpoint or a query string."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404, json={"error": "not found", "detail": "nope"})

    calls = {
        "j-x?x=1": ("/v1/jobs/j-x%3Fx%3D1", lambda c, v: c.job(v)),
        "j-x#x": ("/v1/jobs/j-x%23x/cancel", lambda c, v: c.cancel(v)),
        "%2e%2e": ("/v1/jobs/%252e%252e/suspend", lambda c, v: c.suspend(v)),
        "..": ("/v1/jobs/%2E%2E/why", lambda c, v: c.why(v)),
        "n 0?": ("/v1/nodes/n%200%3F/cordon", lambda c, v: c.cordon(v, "r")),
        "q&x": ("/v1/queues/q%26x/grants", lambda c, v: c.grant_queue(v, "bob")),
        "t?": ("/v1/tenants/t%3F", lambda c, v: c.delete_tenant(v)),
        "p#": ("/v1/priority-classes/p%23", lambda c, v: c.delete_priority_class(v)),
        "d?": ("/v1/datasets/d%3F/warm", lambda c, v: c.warm_dataset(v)),
    }
    with Client("http://sluice.test", "t", transport=httpx.MockTransport(handler)) as c:
        for value, (path, call) in calls.items():
            with pytest.raises(NotFoundError):
                call(c, value)
            assert seen[-1].url.raw_path.split(b"?")[0].decode() == path, value
        assert seen[0].url.query == b""  # `?x=1` is part of the id, not a query string
        n = len(seen)
        for value, what in (("", "job id"), ("j-x/cancel", "job id")):
            with pytest.raises(BadRequestError, match=what):
                c.suspend(value)
        with pytest.raises(BadRequestError, match="node name may not be empty"):
            c.uncordon("")
        with pytest.raises(BadRequestError, match="queue name may not be empty"):
            c.delete_queue("")
        assert len(seen) == n  # refused here, no request


def test_cli_job_get_with_a_query_in_the_id_is_not_the_job(live: Live) -> None:
    with Client() as c:
        job = c.submit(SPEC)
    rc, out, err = run_cli("job", "get", f"{job.id}?x=1")
    assert rc == 1 and f"job '{job.id}?x=1' not found" in err, (out, err)
    rc, out, err = run_cli("job", "get", "")
    assert rc == 2 and "job id may not be empty" in err and "pydantic" not in err, (out, err)
