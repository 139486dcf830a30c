"""The REST API over a real ControlPlane (SqlStore on tmp_path, kube policy) and the
FakeEngine of tests/unit/fake_engine.py — a fake because these tests are about HTTP, auth and
validation, not processes (the CLI tests run a live server; engine tests run real jobs)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.api.app import create_app
from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobStarted, NodeInfo, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import SpecError, TenantSpec, parse_job_spec
from sluice.store.sql import SqlStore

from .fake_engine import FakeEngine


@dataclass
class LoggingFakeEngine(FakeEngine):
    """FakeEngine whose jobs 'write' logs to files the test fills in."""

    log_dir: Path = Path("/nonexistent")
    earlier: dict[str, list[str]] = field(default_factory=dict)

    def log_path(self, job_id: str) -> str | None:
        return str(self.log_dir / f"{job_id}.log")

    def earlier_logs(self, job_id: str) -> list[str]:
        return self.earlier.get(job_id, [])


@dataclass
class Env:
    plane: ControlPlane
    engine: LoggingFakeEngine
    client: TestClient
    admin: dict[str, str]
    alice: dict[str, str]
    bob: dict[str, str]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    settings = Settings(home=tmp_path / "home", max_body_bytes=64 * 1024)
    engine = LoggingFakeEngine(log_dir=tmp_path)
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    from sluice.spec import TenantSpec

    _, alice = plane.create_tenant(admin, TenantSpec(name="alice"))
    _, bob = plane.create_tenant(admin, TenantSpec(name="bob"))
    with TestClient(create_app(plane)) as client:
        yield Env(plane, engine, client, bearer(tokens["admin"]), bearer(alice), bearer(bob))
    plane.store.close()


GOOD = {"name": "mnist", "command": ["python", "train.py"], "resources": {"cpu": {"min": 1, "max": 2}}}


def submit(env: Env, who: dict[str, str], body: Any = None) -> dict[str, Any]:
    r = env.client.post("/v1/jobs", json=body or GOOD, headers=who)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def nothing_stored(env: Env) -> bool:
    return env.plane.store.list_jobs() == [] and env.plane.store.events() == []


# --------------------------------------------------------------------------- auth


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer slc_wrong"}, {"Authorization": "Basic YWxpY2U6eA=="}, {"Authorization": "Bearer"}],
    ids=["missing", "wrong", "basic-scheme", "empty"],
)
def test_bad_or_missing_token_is_401(env: Env, headers: dict[str, str]) -> None:
    for method, url in [("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/nodes"), ("GET", "/v1/tenants")]:
        r = env.client.request(method, url, headers=headers, json=GOOD if method == "POST" else None)
        assert r.status_code == 401, (method, url, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == "unauthorized"
    assert nothing_stored(env)


def test_tenant_routes_are_admin_only(env: Env) -> None:
    assert env.client.get("/v1/tenants", headers=env.alice).status_code == 403
    r = env.client.post("/v1/tenants", json={"name": "mallory", "admin": True}, headers=env.alice)
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert env.client.delete("/v1/tenants/bob", headers=env.alice).status_code == 403
    assert env.plane.store.get_tenant("mallory") is None and env.plane.store.get_tenant("bob") is not None
    assert env.client.post("/v1/nodes/n0/cordon", json={"reason": "x"}, headers=env.alice).status_code == 403


def test_another_tenants_job_is_indistinguishable_from_a_missing_one(env: Env) -> None:
    job = submit(env, env.alice)
    for suffix, method in [("", "GET"), ("/why", "GET"), ("/logs", "GET"), ("/progress", "GET"), ("/cancel", "POST")]:
        theirs = env.client.request(method, f"/v1/jobs/{job['id']}{suffix}", headers=env.bob)
        missing = env.client.request(method, f"/v1/jobs/j-doesnotexist{suffix}", headers=env.bob)
        assert theirs.status_code == missing.status_code == 404, suffix
        assert theirs.json() == {"error": "not found", "detail": f"job {job['id']} not found"}
        assert missing.json() == {"error": "not found", "detail": "job j-doesnotexist not found"}
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=env.bob).json()["items"]] == []
    assert env.plane.store.get_job(job["id"]).phase == Phase.PENDING  # bob's cancel did nothing
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=env.admin).json()["items"]] == [job["id"]]


def test_submitting_as_another_tenant_is_forbidden(env: Env) -> None:
    r = env.client.post("/v1/jobs", json={**GOOD, "tenant": "bob"}, headers=env.alice)
    assert r.status_code == 403 and "tenant" in r.json()["detail"]
    assert nothing_stored(env)


# --------------------------------------------------------------------------- bad specs


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({**GOOD, "max_restart": 3}, "max_restart", "unknown field"),
        ({**GOOD, "max_restarts": "lots"}, "max_restarts", "integer"),
        ({**GOOD, "resources": {"cpu": {"min": -1}}}, "resources.cpu.min", "greater than 0"),
        ({"name": "x"}, "command", "required field is missing"),
        ({**GOOD, "command": "python train.py; rm -rf /"}, "command", "not a shell string"),
        ({**GOOD, "command": ["sh", "-c", "python train.py"]}, "command", "shell"),
        ({**GOOD, "env": {"SLUICE_HOME": "/"}}, "env", "set by sluice"),
        ([1, 2], "(body)", "expected a mapping, got a list"),
        # the CLI's words, not pydantic's "a valid dictionary or object to extract fields from"
        ({**GOOD, "array": 8}, "array", "expected a mapping, got the number 8"),
        ({**GOOD, "resources": {"replicas": 2}}, "resources.replicas", "expected a mapping, got the number 2"),
        ({**GOOD, "resources": {"cpu": {"min": True, "max": 1}}}, "resources.cpu.min", "expected a number, not true"),
        ({**GOOD, "name": "MyJob"}, "name", "'MyJob' is not a valid name: use 1 to 63 lowercase letters"),
    ],
    ids=[
        "unknown-field",
        "wrong-type",
        "negative-cpu",
        "missing-command",
        "shell-string",
        "sh-c",
        "env",
        "not-a-map",
        "array-a-number",
        "replicas-a-number",
        "bool-cpu",
        "bad-name",
    ],
)
def test_bad_spec_is_422_naming_the_field_and_stores_nothing(env: Env, body: Any, field: str, words: str) -> None:
    r = env.client.post("/v1/jobs", json=body, headers=env.alice)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["error"] == "invalid spec"
    assert any(p["field"] == field and words in p["problem"] for p in out["problems"]), out
    assert nothing_stored(env)


def test_malformed_json_is_422_and_stores_nothing(env: Env) -> None:
    r = env.client.post(
        "/v1/jobs", content=b'{"command": ["python"', headers={**env.alice, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert "not valid JSON" in r.json()["problems"][0]["problem"]
    assert nothing_stored(env)


def test_ten_megabyte_body_is_413_before_parsing(env: Env) -> None:
    big = {**GOOD, "labels": {"blob": "x" * (10 * 1024 * 1024)}}
    r = env.client.post("/v1/jobs", json=big, headers=env.alice)
    assert r.status_code == 413
    assert "larger than the limit" in r.json()["detail"]
    assert nothing_stored(env)


def test_streamed_body_without_length_is_cut_off_at_the_limit(env: Env) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"command": ["python"], "labels": {"blob": "'
        for _ in range(200):
            yield b"y" * 1024
        yield b'"}}'

    r = env.client.post("/v1/jobs", content=chunks(), headers={**env.alice, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert nothing_stored(env)


# --------------------------------------------------------------------------- jobs end to end


def test_submit_list_get_cancel_why(env: Env) -> None:
    job = submit(env, env.alice)
    assert job["phase"] == "Pending" and job["tenant"] == "alice" and job["spec"]["command"] == ["python", "train.py"]
    env.plane.step()  # admitted and placed by the kube policy
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.alice).json()
    assert got["phase"] == "Starting" and got["allocation"][0]["node"] in ("n0", "n1")
    starting = env.client.get("/v1/jobs", params={"phase": "Starting"}, headers=env.alice).json()["items"]
    assert [j["id"] for j in starting] == [job["id"]]
    assert env.client.get("/v1/jobs", params={"phase": "Queued"}, headers=env.alice).json()["items"] == []
    for spelling in ("starting", "STARTING", "sTaRtInG"):
        got_any_case = env.client.get("/v1/jobs", params={"phase": spelling}, headers=env.alice)
        assert got_any_case.status_code == 200 and got_any_case.json()["items"] == starting, spelling
    bad_phase = env.client.get("/v1/jobs", params={"phase": "Sleeping"}, headers=env.alice)
    assert bad_phase.status_code == 422 and bad_phase.json()["problems"][0]["field"].startswith("phase")

    cancelled = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.alice)
    assert cancelled.status_code == 200
    attempt = env.plane.controller.book.get(job["id"]).attempt
    env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, -15))
    env.plane.step()
    assert env.client.get(f"/v1/jobs/{job['id']}", headers=env.alice).json()["phase"] == "Cancelled"
    again = env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=env.alice)
    assert again.status_code == 409 and again.json()["error"] == "conflict"

    why = env.client.get(f"/v1/jobs/{job['id']}/why", headers=env.alice).json()["items"]
    seqs = [e["seq"] for e in why]
    assert seqs == sorted(seqs)
    text = " | ".join(e["message"] for e in why)
    assert "submitted by tenant alice" in text and "Cancelled" in text
    assert "Queued -> Starting: kube: fits on" in text  # the placement decision with its reason


def test_logs_plain_and_followed_until_the_job_ends(env: Env) -> None:
    job = submit(env, env.alice)
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    env.engine.pending.append(JobStarted(job["id"], attempt, "n0", env.engine.now, pid=1))
    env.plane.step()
    log = env.engine.log_dir / f"{job['id']}.log"
    log.write_text("epoch 1\n")
    assert env.client.get(f"/v1/jobs/{job['id']}/logs", headers=env.alice).text == "epoch 1\n"

    def finish() -> None:
        with log.open("a") as f:
            f.write("epoch 2\ndone\n")
        env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
        env.plane.step()

    received = []
    with env.client.stream("GET", f"/v1/jobs/{job['id']}/logs?follow=true", headers=env.alice) as r:
        assert r.status_code == 200
        finisher = None
        for chunk in r.iter_text():
            received.append(chunk)
            if finisher is None:
                finisher = threading.Thread(target=finish)
                finisher.start()
        assert finisher is not None
        finisher.join()
    assert "".join(received) == "epoch 1\nepoch 2\ndone\n"
    assert env.plane.store.get_job(job["id"]).phase == Phase.SUCCEEDED


def test_logs_of_a_moved_job_carry_every_attempt_oldest_first(env: Env) -> None:
    """On Ray each node writes its own log: `job logs` showed only the newest node's, so what
    attempt 1 printed before its node was lost was out of reach (walkthrough 4)."""
    job = submit(env, env.alice)
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    env.engine.pending.append(JobStarted(job["id"], attempt, "n0", env.engine.now, pid=1))
    env.plane.step()
    first, second = env.engine.log_dir / "n1.log", env.engine.log_dir / "n2.log"
    first.write_text("attempt 1 on n1\nstep 10\nstep 20")  # cut off mid-line by the node's loss
    second.write_text("attempt 2 on n2\nstep 30\n")
    env.engine.earlier[job["id"]] = [str(first), str(second)]
    (env.engine.log_dir / f"{job['id']}.log").write_text("attempt 3 on n0\nstep 40\n")
    url = f"/v1/jobs/{job['id']}/logs"
    whole = "attempt 1 on n1\nstep 10\nstep 20\nattempt 2 on n2\nstep 30\nattempt 3 on n0\nstep 40\n"
    assert env.client.get(url, headers=env.alice).text == whole
    assert (
        env.client.get(url, params={"tail": 4}, headers=env.alice).text
        == "attempt 2 on n2\nstep 30\nattempt 3 on n0\nstep 40\n"
    )
    assert env.client.get(url, params={"tail": 5}, headers=env.alice).text.startswith("step 20\nattempt 2")
    assert env.client.get(url, params={"tail": 1}, headers=env.alice).text == "step 40\n"
    assert env.client.get(url, headers=env.bob).status_code == 404  # another tenant's job

    env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
    env.plane.step()
    with env.client.stream("GET", url, params={"follow": "true"}, headers=env.alice) as r:
        assert "".join(r.iter_text()) == whole
    with env.client.stream("GET", url, params={"follow": "true", "tail": 3}, headers=env.alice) as r:
        assert "".join(r.iter_text()) == "step 30\nattempt 3 on n0\nstep 40\n"


def test_a_job_back_on_a_node_it_ran_on_reads_in_attempt_order(env: Env) -> None:
    """Node A ran attempts 1 and 3 of the job (one log), node B attempt 2: the agents' index
    beside each log says where each attempt starts, and a read puts them in order (whole
    files, oldest write first, gave 2 before 1 and 3)."""
    from sluice.model.runfolder import JOB_LOG_INDEX

    job = submit(env, env.alice)
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    a = env.engine.log_dir / f"{job['id']}.log"  # the newest attempt's node: A
    a.write_text("attempt 1 on A\nstep 10\nattempt 3 on A\nstep 30\n")
    third = len("attempt 1 on A\nstep 10\n")
    (env.engine.log_dir / JOB_LOG_INDEX).write_text(f"1 0\n3 {third}\n")
    (env.engine.log_dir / "b").mkdir()
    b = env.engine.log_dir / "b" / "job.log"
    b.write_text("attempt 2 on B\nstep 20\n")
    (env.engine.log_dir / "b" / JOB_LOG_INDEX).write_text("2 0\n")
    env.engine.earlier[job["id"]] = [str(b)]
    url = f"/v1/jobs/{job['id']}/logs"
    ordered = "attempt 1 on A\nstep 10\nattempt 2 on B\nstep 20\nattempt 3 on A\nstep 30\n"
    assert env.client.get(url, headers=env.alice).text == ordered
    assert env.client.get(url, params={"tail": 3}, headers=env.alice).text == "step 20\nattempt 3 on A\nstep 30\n"
    env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
    env.plane.step()
    with env.client.stream("GET", url, params={"follow": "true"}, headers=env.alice) as r:
        assert "".join(r.iter_text()) == ordered
    with env.client.stream("GET", url, params={"follow": "true", "tail": 2}, headers=env.alice) as r:
        assert "".join(r.iter_text()) == "attempt 3 on A\nstep 30\n"


def test_one_replicas_log_where_the_engine_keeps_one_per_replica(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Ray each replica of a gang logs on its node and `job logs` showed rank 0's only: a
    crash on rank 1 was out of the user's reach (walk 6). `?replica=K` reads rank K's."""
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 1, "replicas": {"min": 2}}})
    url = f"/v1/jobs/{job['id']}/logs"
    # The local engine (and this fake) writes every replica into the one log: refused, said why.
    r = env.client.get(url, params={"replica": 1}, headers=env.alice)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "replica", r.text
    assert "[rankK]" in r.text
    rank1 = env.engine.log_dir / "rank1.log"
    rank1.write_text("===== rank 1 =====\nTraceback: boom\n")
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(rank1) if k == 1 else None)
    assert env.client.get(url, params={"replica": 1}, headers=env.alice).text.endswith("Traceback: boom\n")
    assert env.client.get(url, params={"replica": 1, "tail": 1}, headers=env.alice).text == "Traceback: boom\n"
    r = env.client.get(url, params={"replica": 2}, headers=env.alice)
    assert r.status_code == 422 and "runs 2 replicas: give 0 to 1" in r.text
    r = env.client.get(url, params={"replica": 2, "follow": "true"}, headers=env.alice)
    assert r.status_code == 422  # judged before the stream starts
    assert env.client.get(url, params={"replica": 1}, headers=env.bob).status_code == 404


def test_every_replicas_log_at_once_each_line_with_its_rank(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Ray a gang's plain log is rank 0's; a user had to ask for each rank in turn
    (`--replica K`). `?all_replicas=true` gives every rank's lines, prefixed as the local
    engine's one log has them; followed, the ranks' new lines as they come, whole."""
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 1, "replicas": {"min": 2}}})
    url = f"/v1/jobs/{job['id']}/logs"
    one = env.engine.log_dir / f"{job['id']}.log"
    one.write_text("[rank0] a\n[rank1] x\n")
    # The local engine (and this fake) keeps one log with every replica in it: that log, as it is.
    assert env.client.get(url, params={"all_replicas": "true"}, headers=env.alice).text == one.read_text()
    ranks = [env.engine.log_dir / "r0.log", env.engine.log_dir / "r1.log"]
    ranks[0].write_text("a\nb")  # rank 0 is mid-line
    ranks[1].write_text("x\ny\n")
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(ranks[k]))
    got = env.client.get(url, params={"all_replicas": "true"}, headers=env.alice).text
    assert got == "[rank0] a\n[rank0] b\n[rank1] x\n[rank1] y\n"
    got = env.client.get(url, params={"all_replicas": "true", "tail": 1}, headers=env.alice).text
    assert got == "[rank0] b\n[rank1] y\n"
    r = env.client.get(url, params={"all_replicas": "true", "replica": 1}, headers=env.alice)
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "all_replicas", r.text
    assert env.client.get(url, params={"all_replicas": "true"}, headers=env.bob).status_code == 404

    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt

    def finish() -> None:
        with ranks[0].open("a") as f:
            f.write(" end\nc\n")  # rank 0's held line ends, whole
        with ranks[1].open("a") as f:
            f.write("z")  # rank 1 ends without a newline
        env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
        env.plane.step()

    received = []
    with env.client.stream("GET", url, params={"all_replicas": "true", "follow": "true"}, headers=env.alice) as r:
        assert r.status_code == 200
        finisher = None
        for chunk in r.iter_text():
            received.append(chunk)
            if finisher is None:
                finisher = threading.Thread(target=finish)
                finisher.start()
        assert finisher is not None
        finisher.join()
    lines = "".join(received).splitlines()
    assert sorted(lines) == sorted(["[rank0] a", "[rank0] b end", "[rank0] c", "[rank1] x", "[rank1] y", "[rank1] z"])
    assert lines.index("[rank0] a") < lines.index("[rank0] b end") < lines.index("[rank0] c")
    with env.client.stream(
        "GET", url, params={"all_replicas": "true", "follow": "true", "tail": 1}, headers=env.alice
    ) as r:
        assert "".join(r.iter_text()) == "[rank0] c\n[rank1] z\n"


def test_following_every_replica_picks_up_replicas_that_start_later(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica with no log yet (not started), and a gang resized to more replicas while
    followed: their lines are followed too once their logs exist."""
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 1, "replicas": {"min": 2}}})
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    logs = [env.engine.log_dir / f"r{k}.log" for k in range(3)]
    logs[0].write_text("zero\n")
    calls = []

    def replica_logs(caller: object, job_id: str) -> list[Path | None]:
        calls.append(job_id)
        if len(calls) == 1:
            return [logs[0], None]  # rank 1 has not started yet
        for k in (1, 2):
            logs[k].write_text(f"r{k}\n")
        env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
        env.plane.step()
        return logs  # ... and the gang now runs three

    monkeypatch.setattr(env.plane, "replica_logs", replica_logs)
    url = f"/v1/jobs/{job['id']}/logs"
    with env.client.stream("GET", url, params={"all_replicas": "true", "follow": "true"}, headers=env.alice) as r:
        got = "".join(r.iter_text())
    assert got == "[rank0] zero\n[rank1] r1\n[rank2] r2\n"


def test_a_fast_replica_does_not_hold_the_others_lines_back(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Red team (s22): a followed all-replicas view read one replica's log until it had caught
    up with it, so a replica that wrote faster than the server read kept the others' lines
    waiting. Now each replica gets at most a round's share before the next one's turn."""
    from sluice.api.job_logs import LOG_CHUNK
    from sluice.api.routes.jobs import FOLLOW_CHUNKS_PER_ROUND

    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 1, "replicas": {"min": 2}}})
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    ranks = [env.engine.log_dir / "fast.log", env.engine.log_dir / "slow.log"]
    share = FOLLOW_CHUNKS_PER_ROUND * LOG_CHUNK
    ranks[0].write_bytes((b"x" * 1023 + b"\n") * (4 * share // 1024))
    ranks[1].write_text("one\n")
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(ranks[k]))

    def finish() -> None:
        env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
        env.plane.step()

    url = f"/v1/jobs/{job['id']}/logs"
    received, before, finisher = b"", None, None
    with env.client.stream("GET", url, params={"all_replicas": "true", "follow": "true"}, headers=env.alice) as r:
        for chunk in r.iter_bytes():
            received += chunk
            if before is None and b"[rank1] one\n" in received:
                before = received.index(b"[rank1] one\n")
                finisher = threading.Thread(target=finish)
                finisher.start()
    assert finisher is not None and before is not None
    finisher.join()
    # rank 1's line came after about one share of rank 0's (prefixes included), not all four
    assert before < 2 * share, before
    assert received.count(b"[rank0] ") == 4 * share // 1024  # and nothing of rank 0's was lost


def test_progress_after_reports(env: Env) -> None:
    from sluice.model import JobProgress

    job = submit(env, env.alice)
    assert env.client.get(f"/v1/jobs/{job['id']}/progress", headers=env.alice).status_code == 200
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    env.engine.pending += [
        JobStarted(job["id"], attempt, "n0", env.engine.now),
        JobProgress(job["id"], attempt, env.engine.now + 1, step=10, loss=2.0),
        JobProgress(job["id"], attempt, env.engine.now + 2, step=20, loss=float("nan")),
    ]
    env.plane.step()
    prog = env.client.get(f"/v1/jobs/{job['id']}/progress", headers=env.alice)
    assert prog.status_code == 200
    assert prog.json()["step"] == 20


# --------------------------------------------------------------------------- nodes, tenants, system


def test_nodes_cordon_and_uncordon(env: Env) -> None:
    names = [n["name"] for n in env.client.get("/v1/nodes", headers=env.alice).json()["items"]]
    assert names == ["n0", "n1"]
    missing_reason = env.client.post("/v1/nodes/n0/cordon", json={}, headers=env.admin)
    assert missing_reason.status_code == 422 and missing_reason.json()["problems"][0]["field"] == "reason"
    r = env.client.post("/v1/nodes/n0/cordon", json={"reason": "disk failing"}, headers=env.admin)
    assert r.status_code == 200 and r.json()["health"] == "Cordoned" and r.json()["reason"] == "disk failing"
    assert r.json()["moved_jobs"] == [] and r.json()["other_schedulable_nodes"] == 1
    assert env.client.post("/v1/nodes/nx/cordon", json={"reason": "x"}, headers=env.admin).status_code == 404
    r = env.client.post("/v1/nodes/n0/uncordon", headers=env.admin)
    assert r.status_code == 200 and r.json()["health"] == "Healthy"
    assert [e.message for e in env.plane.store.events(node="n0")][-2:] == [
        "n0 -> Cordoned: disk failing",
        "n0 -> Healthy: uncordoned by operator",
    ]


def test_tenants_create_list_delete(env: Env) -> None:
    r = env.client.post("/v1/tenants", json={"name": "carol", "max_running_jobs": 2}, headers=env.admin)
    assert r.status_code == 201
    token = r.json()["token"]
    stored = env.plane.store.get_tenant("carol")
    assert stored is not None and stored.max_running_jobs == 2 and token not in stored.token_hash
    listed = env.client.get("/v1/tenants", headers=env.admin).json()["items"]
    assert [t["name"] for t in listed] == ["admin", "alice", "bob", "carol", "default"]
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert env.client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    bad = env.client.post("/v1/tenants", json={"name": "Not Valid!"}, headers=env.admin)
    assert bad.status_code == 422 and bad.json()["problems"][0]["field"] == "name"
    assert env.client.post("/v1/tenants", json={"name": "carol"}, headers=env.admin).status_code == 409
    assert env.client.delete("/v1/tenants/carol", headers=env.admin).status_code == 204
    assert env.client.get("/v1/jobs", headers=bearer(token)).status_code == 401
    assert env.client.delete("/v1/tenants/carol", headers=env.admin).status_code == 404


def test_a_database_that_cannot_be_read_is_a_503_and_healthz_is_not_ok(env: Env) -> None:
    """PostgreSQL stopped under a running plane: every read was a bare 500 and /healthz said
    ok (walkthrough 4). Here the SQLite file's folder goes away under a real engine."""
    db = Path(env.plane.settings.db_url.removeprefix("sqlite:///"))
    assert db.exists()
    folder = db.parent
    env.plane.store._engine.dispose()  # type: ignore[attr-defined]  # pooled connections would keep the old file
    moved = folder.with_name(folder.name + "-away")
    folder.rename(moved)
    try:
        health = env.client.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert str(folder) not in health.text  # unauthenticated: no path
        read = env.client.get("/v1/jobs", headers=env.alice)
        assert read.status_code == 503 and read.headers["retry-after"] == "5"
        assert read.json()["error"] == "unavailable" and "the database cannot be read" in read.json()["detail"]
    finally:
        moved.rename(folder)
    assert env.client.get("/healthz").json() == {"status": "ok"}
    assert env.client.get("/v1/jobs", headers=env.alice).status_code == 200


def test_a_plane_that_lost_its_database_to_another_stops_reconciling_and_says_so(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL restart ended the session holding the plane's lock and a second plane took
    the database (tests/integration/test_postgres_store.py): the first must stop acting."""
    from sluice.store import StoreInUse

    def taken() -> None:
        raise StoreInUse("another control plane ... holds it; one database serves one plane")

    monkeypatch.setattr(env.plane.store, "keep_claim", taken, raising=False)
    env.plane.start()
    thread = env.plane._thread
    assert thread is not None
    thread.join(timeout=10)
    assert not thread.is_alive() and env.plane.lost_database is not None
    health = env.client.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "stopped"
    env.plane.stop()


def test_a_plane_whose_ray_namespace_another_took_stops_reconciling_and_says_so(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Ray namespace's record was lost with its node and a second plane started in the gap
    (Ray walk s30: the first went on beside it, both driving the same agents): the engine's
    poll raises EngineTaken, and the plane stops acting as when its database was taken."""
    from sluice.engine.base import EngineTaken

    polls = [0]

    def taken() -> list[object]:
        polls[0] += 1
        if polls[0] == 1:  # recovery's: the claim was this plane's when it started
            return []
        raise EngineTaken("another plane (home /h2 on host, pid 2) took the Ray namespace 'sluice'")

    monkeypatch.setattr(env.engine, "poll", taken)
    env.plane.start()
    thread = env.plane._thread
    assert thread is not None
    thread.join(timeout=10)
    assert not thread.is_alive() and "took the Ray namespace" in (env.plane.lost_database or "")
    health = env.client.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "stopped"
    assert "Ray namespace" in health.json()["detail"]
    r = env.client.post("/v1/jobs", json=GOOD, headers=env.alice)
    assert r.status_code == 503 and "took the Ray namespace" in r.json()["detail"]
    env.plane.stop()


def test_the_plane_checks_its_hold_on_the_database_before_every_round(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second plane may claim a restarted PostgreSQL as soon as it is back: checked every
    5 s, this plane went on acting for up to 5 s beside it. Now each round starts with the check."""
    order: list[str] = []
    step = env.plane.controller.step
    monkeypatch.setattr(env.plane.store, "keep_claim", lambda: order.append("claim"), raising=False)

    def counted() -> None:
        order.append("step")
        step()

    monkeypatch.setattr(env.plane.controller, "step", counted)
    env.plane.start()
    try:
        deadline = time.monotonic() + 4.0  # 4 rounds take ~2 s at the 0.5 s interval; at 5 s a check, 15 s
        while order.count("step") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        env.plane.stop()
    rounds = order[: 2 * (len(order) // 2)]
    assert order.count("step") >= 4 and rounds == ["claim", "step"] * (len(rounds) // 2), order


def test_healthz_metrics_and_docs(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok"}
    submit(env, env.alice)
    for _ in range(3):
        env.plane.step()
    metrics = env.client.get("/metrics").text
    assert 'sluice_jobs{phase="Starting"} 1.0' in metrics
    assert 'sluice_jobs{phase="Running"} 0.0' in metrics
    assert "sluice_reconcile_rounds_total 3.0" in metrics
    assert "sluice_reconcile_round_seconds_count 2.0" in metrics  # observed one round late
    paths = env.client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}/why", "/v1/nodes/{name}/cordon", "/v1/tenants"} <= set(paths)
    assert env.client.get("/docs").status_code == 200


# --------------------------------------------------------------------------- pagination


def walk(env: Env, path: str, who: dict[str, str], limit: int) -> list[dict[str, Any]]:
    """Every item of a list endpoint, page by page, checking each page's size."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        r = env.client.get(path, params=params, headers=who)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["items"]) <= limit
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert len(page["items"]) == limit  # only a full page promises more


def test_a_jobs_history_does_not_count_other_tenants_events(env: Env) -> None:
    """Event numbers in `job why` were the store's sequence, shared by every tenant: the gap
    between two of alice's events said how many events bob's jobs made meanwhile (queuewalk
    s32). They are now the job's own count, and so is the cursor."""
    mine = submit(env, env.alice)["id"]
    before = env.client.get(f"/v1/jobs/{mine}/why", headers=env.alice).json()["items"]
    for _ in range(5):
        submit(env, env.bob)
    env.client.post(f"/v1/jobs/{mine}/cancel", headers=env.alice)
    after = walk(env, f"/v1/jobs/{mine}/why", env.alice, 1)
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1)) and len(after) > len(before)
    cursor = env.client.get(f"/v1/jobs/{mine}/why?limit=1", headers=env.alice).json()["next_cursor"]
    assert json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))) == {"k": "job-events", "v": [1]}


def test_every_list_endpoint_pages_with_limit_and_cursor(env: Env) -> None:
    ids = [submit(env, env.alice)["id"] for _ in range(5)]
    env.plane.step()  # some are now active in the controller, with phases the store may lag
    one_page = env.client.get("/v1/jobs", headers=env.alice).json()
    listed = [j["id"] for j in one_page["items"]]
    assert sorted(listed) == sorted(ids) and one_page["next_cursor"] is None
    assert [j["id"] for j in walk(env, "/v1/jobs", env.alice, 2)] == listed
    assert [j["id"] for j in walk(env, "/v1/jobs", env.admin, 1)] == listed
    events = walk(env, f"/v1/jobs/{ids[0]}/why", env.alice, 1)
    stored = env.plane.store.events(job_id=ids[0])
    assert [e["message"] for e in events] == [e.message for e in stored] and len(events) >= 2
    assert [e["seq"] for e in events] == list(range(1, len(stored) + 1))  # the job's own count
    names = [t["name"] for t in walk(env, "/v1/tenants", env.admin, 2)]
    assert names == ["admin", "alice", "bob", "default"]
    assert [n["name"] for n in walk(env, "/v1/nodes", env.alice, 1)] == ["n0", "n1"]
    for name in ("q-b", "q-a"):
        assert env.client.post("/v1/queues", json={"name": name}, headers=env.admin).status_code == 201
    assert [q["name"] for q in walk(env, "/v1/queues", env.admin, 1)] == ["default", "q-a", "q-b"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 10**6}, "limit"),
        ({"limit": 10**30}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"cursor": "not-a-cursor!"}, "cursor"),
        ({"cursor": "eyJrIjoidGVuYW50cyIsInYiOlsiYSJdfQ"}, "cursor"),  # a tenants cursor
        ({"cursor": "W10"}, "cursor"),  # base64 of []
        ({"cursor": "x" * 5000}, "cursor"),
    ],
)
def test_bad_page_parameters_are_422_naming_them(env: Env, params: dict[str, Any], field: str) -> None:
    for path, who in [("/v1/jobs", env.alice), ("/v1/nodes", env.alice), ("/v1/tenants", env.admin)]:
        r = env.client.get(path, params=params, headers=who)
        if path == "/v1/tenants" and params.get("cursor", "").startswith("eyJrIjoidGVuYW50cy"):
            assert r.status_code == 200  # its own cursor
            continue
        assert r.status_code == 422, (path, r.text)
        assert [p["field"] for p in r.json()["problems"]] == [field], r.text


def _cursor(raw: str) -> str:
    import base64

    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/jobs", '{"k":"jobs","v":[1,"\\ud800"]}'),
        ("/v1/jobs", '{"k":"jobs","v":[NaN,"j-1"]}'),
        ("/v1/jobs/{job}/why", '{"k":"job-events","v":[99999999999999999999999999]}'),
        ("/v1/jobs/{job}/why", '{"k":"job-events","v":[-99999999999999999999999999]}'),
        ("/v1/jobs/{job}/why", '{"k":"job-events","v":[-1]}'),  # was read as 0: never given out
        ("/v1/jobs/{job}/why", '{"k":"job-events","v":[0]}'),
        ("/v1/tenants", '{"k":"tenants","v":["\\ud800"]}'),
        ("/v1/datasets", '{"k":"datasets","v":["\\ud800","x"]}'),
    ],
    ids=[
        "jobs-surrogate",
        "jobs-nan",
        "events-huge",
        "events-minus-huge",
        "events-negative",
        "events-zero",
        "tenants-surrogate",
        "datasets-surrogate",
    ],
)
def test_a_forged_cursor_the_store_cannot_take_is_422_not_500(env: Env, path: str, raw: str) -> None:
    """Before: a lone surrogate or an int past 64 bits went on to SQLite: a 500 and a traceback
    in the server's log per request."""
    job = submit(env, env.alice)["id"]
    r = env.client.get(path.format(job=job), params={"cursor": _cursor(raw)}, headers=env.admin)
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == ["cursor"], r.text


# --------------------------------------------------------------------------- capacity at submit


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"cpu": 1000}, "resources.cpu.min", "largest node (n0) has 2"),
        ({"gpus": 64}, "resources.gpus", "largest node (n0) has 0"),
        ({"replicas": {"min": 9}}, "resources.replicas.min", "at most 8"),
        # an elastic range past the engine's limit: every resize into it would be refused
        ({"cpu": 0.1, "replicas": {"min": 1, "max": 9}}, "resources.replicas.max", "9 replicas, but the"),
        ({"cpu": 2, "replicas": {"min": 3}}, "resources.replicas.min", "whole cluster has 4 CPU"),
    ],
)
def test_a_job_no_node_can_ever_hold_is_refused_at_submit(
    env: Env, resources: dict[str, Any], field: str, words: str
) -> None:
    r = env.client.post("/v1/jobs", json={"command": ["python", "x.py"], "resources": resources}, headers=env.alice)
    assert r.status_code == 422, r.text
    problems = r.json()["problems"]
    assert any(p["field"] == field and words in p["problem"] for p in problems), problems
    assert nothing_stored(env)


def test_with_a_growable_cluster_it_waits_with_an_unschedulable_reason(env: Env) -> None:
    env.plane.settings = env.plane.settings.model_copy(update={"allow_unschedulable": True})
    job = submit(env, env.alice, {"command": ["python", "x.py"], "resources": {"cpu": 16}})
    env.plane.step()
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.alice).json()
    assert got["phase"] == "Queued" and got["reason"].startswith("Unschedulable: one replica needs 16 CPU"), got
    assert "largest node has 2 CPU" in got["reason"]
    why = env.client.get(f"/v1/jobs/{job['id']}/why", headers=env.alice).json()["items"]
    assert any(e["message"].startswith("Unschedulable:") or "Unschedulable:" in e["message"] for e in why)
    # the engine's replica limit is not something the cluster grows out of
    r = env.client.post(
        "/v1/jobs", json={"command": ["python", "x.py"], "resources": {"replicas": {"min": 9}}}, headers=env.alice
    )
    assert r.status_code == 422 and r.json()["problems"][0]["field"] == "resources.replicas.min"


# --------------------------------------------------------------------------- hostile values (issue 10)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/tenants", '{"name": "x1", "max_running_jobs": 100000000000000000000}', "max_running_jobs"),
        ("/v1/tenants", '{"name": "x2", "weight": NaN}', "weight"),
        ("/v1/jobs", '{"command": ["x"], "resources": {"cpu": NaN}}', "resources.cpu.min"),
        ("/v1/jobs", '{"command": ["x"], "resources": {"cpu": {"min": 1, "max": Infinity}}}', "resources.cpu.max"),
        ("/v1/jobs", '{"command": ["x"], "qoe": {"loss": -Infinity}}', "qoe.loss"),
        ("/v1/jobs", '{"command": ["x"], "qoe": {"deadline": "0001-01-01T00:00:00"}}', "qoe.deadline"),
        ("/v1/jobs", '{"command": ["x"], "qoe": {"deadline": "0001-01-01T00:00:00Z"}}', "qoe.deadline"),
        ("/v1/jobs", '{"command": ["x"], "qoe": {"deadline_s": 1e300}}', "qoe.deadline_s"),
        ("/v1/jobs", '{"command": ["x"], "priority": 1e400}', "priority"),
        ("/v1/jobs", '{"command": ["x"], "max_restarts": 100000000000000000000000}', "max_restarts"),
        ("/v1/jobs", '{"command": ["x"], "labels": {"a": "\\ud800"}}', "labels.a"),
        ("/v1/jobs", '{"command": ["x"], "workdir": "a\\u0000b"}', "workdir"),
        ("/v1/jobs", '{"command": ["x"], "resources": {"gpus": 64}}', "resources.gpus"),
    ],
)
def test_hostile_values_are_422_naming_the_field(env: Env, path: str, body: str, field: str) -> None:
    r = env.client.post(path, content=body, headers={**env.admin, "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert field in [p["field"] for p in r.json()["problems"]], r.text


def test_memory_mb_the_engine_cannot_enforce_is_refused_at_submit(env: Env) -> None:
    """The fake engine declares no memory controller (memory_limits off): never run unlimited."""
    r = env.client.post(
        "/v1/jobs", json={"command": ["python", "x.py"], "resources": {"memory_mb": 256}}, headers=env.alice
    )
    assert r.status_code == 422, r.text
    problem = r.json()["problems"][0]
    assert problem["field"] == "resources.memory_mb"
    assert "256 MiB cannot be enforced" in problem["problem"] and "memory controller" in problem["problem"]
    assert nothing_stored(env)


@pytest.mark.parametrize(("kinds", "refused"), [(("none", "none"), True), (("none", "cgroup-v2"), False)])
def test_memory_mb_is_refused_only_when_no_node_can_enforce_it(
    tmp_path: Path, kinds: tuple[str, str], refused: bool
) -> None:
    """An engine that can enforce memory (Ray) on nodes that may not (labelled memory-limits=none)."""
    nodes = [NodeInfo(f"n{i}", 2.0, labels={"memory-limits": k}) for i, k in enumerate(kinds)]
    engine = FakeEngine(node_infos=nodes)
    engine.capabilities = replace(engine.capabilities, memory_limits=True)
    settings = Settings(home=tmp_path / "home")
    plane = ControlPlane(settings, SqlStore(settings.db_url), engine, make_policy("kube"))
    try:
        admin = plane.authenticate(plane.bootstrap_tenants()["admin"])
        job = parse_job_spec({"command": ["python", "x.py"], "resources": {"memory_mb": 64}})
        if not refused:
            assert plane.submit(admin, job).spec.resources.memory_mb == 64
            return
        with pytest.raises(SpecError) as err:
            plane.submit(admin, job)
        assert err.value.problems[0].field == "resources.memory_mb"
        assert "no node of the fake engine can enforce memory limits" in err.value.problems[0].problem
    finally:
        plane.store.close()


def _problem(r: Any, field: str) -> str:
    assert r.status_code == 422, r.text
    out = r.json()
    hits = [p["problem"] for p in out["problems"] if p["field"] == field]
    assert hits, out
    return str(hits[0])


@pytest.mark.parametrize(
    ("url", "body", "field", "words"),
    [
        ("/v1/tenants", {"name": "eve", "admin": "yes"}, "admin", "expected true or false, not 'yes'"),
        ("/v1/tenants", {"name": "eve", "admin": 1}, "admin", "expected true or false, not 1"),
        ("/v1/tenants", {"name": "eve", "weight": "2"}, "weight", "expected a number, not '2'"),
        ("/v1/tenants", {"name": "eve", "weight": 1e-300}, "weight", "greater than or equal to 0.001"),
        ("/v1/tenants", {"name": "eve", "weight": 1001}, "weight", "less than or equal to 1000"),
        ("/v1/tenants", {"name": "eve", "max_running_jobs": "3"}, "max_running_jobs", "expected a number"),
        ("/v1/tenants", {"name": "eve", "max_running_jobs": True}, "max_running_jobs", "expected a number"),
        ("/v1/queues", {"name": "q9", "weight": "2"}, "weight", "expected a number, not '2'"),
        ("/v1/queues", {"name": "q9", "weight": 1e-300}, "weight", "greater than or equal to 0.001"),
        ("/v1/queues", {"name": "q9", "nominal": {"cores": "1"}}, "nominal.cores", "expected a number, not '1'"),
        ("/v1/queues", {"name": "q9", "nominal": {"jobs": "1"}}, "nominal.jobs", "expected a number"),
        ("/v1/queues", {"name": "q9", "lending_limit": {"gpus": True}}, "lending_limit.gpus", "not true"),
        ("/v1/priority-classes", {"name": "p", "value": "7"}, "value", "expected a number, not '7'"),
        ("/v1/priority-classes", {"name": "p", "value": 7, "default": "yes"}, "default", "expected true or false"),
        ("/v1/queues/default/grants", {"tenant": "alice", "granted": "yes"}, "granted", "expected true or false"),
    ],
)
def test_admin_request_bodies_take_exact_types_and_bounded_weights(
    env: Env, url: str, body: dict[str, Any], field: str, words: str
) -> None:
    """`{"admin": "yes"}` made an admin tenant; strings, 1 and 1e-300 read as numbers/booleans."""
    before = [t.name for t in env.plane.store.list_tenants()]
    r = env.client.post(url, json=body, headers=env.admin)
    assert words in _problem(r, field)
    assert r.json()["error"] == "invalid request"
    assert [t.name for t in env.plane.store.list_tenants()] == before


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/v1/tenants/alice", {"weight": "2"}, "weight"),
        ("/v1/tenants/alice", {"weight": 0.0001}, "weight"),
        ("/v1/tenants/alice", {"max_running_jobs": "0"}, "max_running_jobs"),
        ("/v1/queues/default", {"weight": "2"}, "weight"),
        ("/v1/queues/default", {"nominal": {"cores": "1"}}, "nominal.cores"),
    ],
)
def test_admin_patches_take_exact_types(env: Env, url: str, body: dict[str, Any], field: str) -> None:
    _problem(env.client.patch(url, json=body, headers=env.admin), field)


def test_exact_types_still_take_what_was_right(env: Env) -> None:
    r = env.client.post("/v1/tenants", json={"name": "eve", "admin": False, "weight": 2}, headers=env.admin)
    assert r.status_code == 201 and r.json()["weight"] == 2.0, r.text
    r = env.client.post("/v1/queues", json={"name": "q9", "nominal": {"cores": 1.5, "jobs": 2}}, headers=env.admin)
    assert r.status_code == 201, r.text
    r = env.client.post("/v1/priority-classes", json={"name": "p", "value": 7, "default": False}, headers=env.admin)
    assert r.status_code == 201, r.text
    assert env.client.post("/v1/queues/q9/grants", json={"tenant": "eve"}, headers=env.admin).status_code == 200


def test_max_running_jobs_zero_means_no_limit_on_create_as_on_set(env: Env) -> None:
    r = env.client.post("/v1/tenants", json={"name": "eve", "max_running_jobs": 0}, headers=env.admin)
    assert r.status_code == 201 and r.json()["max_running_jobs"] is None, r.text
    r = env.client.patch("/v1/tenants/eve", json={"max_running_jobs": 3}, headers=env.admin)
    assert r.json()["max_running_jobs"] == 3
    r = env.client.patch("/v1/tenants/eve", json={"max_running_jobs": 0}, headers=env.admin)
    assert r.json()["max_running_jobs"] is None


@pytest.mark.parametrize("name", ["default", "admin"])
def test_the_built_in_tenants_cannot_be_deleted(env: Env, name: str) -> None:
    """Deleting `default` made every plain CLI call a 401; another admin cannot do it either."""
    admin = env.plane.authenticate(env.admin["Authorization"].removeprefix("Bearer "))
    _, ops = env.plane.create_tenant(admin, TenantSpec(name="ops", admin=True))
    r = env.client.delete(f"/v1/tenants/{name}", headers=bearer(ops))
    assert r.status_code == 409, r.text
    assert f"the built-in {name} tenant cannot be deleted" in r.json()["detail"]
    assert env.plane.store.get_tenant(name) is not None


def test_jobs_query_errors_are_invalid_request_and_spec_errors_invalid_spec(env: Env) -> None:
    for query in ("limit=-1", "phase=bogus", "limit=x"):
        r = env.client.get(f"/v1/jobs?{query}", headers=env.alice)
        assert r.status_code == 422 and r.json()["error"] == "invalid request", (query, r.text)
    r = env.client.post("/v1/jobs", json={"name": "x"}, headers=env.alice)
    assert r.status_code == 422 and r.json()["error"] == "invalid spec"


def test_a_problem_found_by_the_plane_outside_a_job_spec_is_invalid_request(env: Env) -> None:
    # The plane's own checks (a SpecError) said "invalid spec" on every endpoint: a queue body,
    # or `logs?replica=1` on an engine with one log per job (the CLI printed "error: invalid
    # spec" above a problem with its --replica option).
    body = {"name": "q", "nominal": {"cores": 1}, "borrowing_limit": {"cores": 5}}
    r = env.client.post("/v1/queues", json=body, headers=env.admin)
    assert r.status_code == 422 and r.json()["error"] == "invalid request", r.text
    assert [p["field"] for p in r.json()["problems"]] == ["borrowing_limit.cores"]
    job = env.client.post("/v1/jobs", json={**GOOD, "resources": {"replicas": {"min": 2}}}, headers=env.alice).json()
    r = env.client.get(f"/v1/jobs/{job['id']}/logs?replica=1", headers=env.alice)
    assert r.status_code == 422 and r.json()["error"] == "invalid request", r.text
    assert [p["field"] for p in r.json()["problems"]] == ["replica"]


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("   ", "may not be empty or only whitespace"),
        ("\t\n", "may not be empty or only whitespace"),
        ("disk\nn0 -> Healthy: forged", "control characters"),
        ("\x1b[31mred\x1b[0m", "control characters"),
        ("a\u2028b", "control characters"),
        (5, "expected text, got the number 5"),
    ],
)
def test_a_cordon_reason_is_one_line_of_text(env: Env, reason: Any, words: str) -> None:
    r = env.client.post("/v1/nodes/n0/cordon", json={"reason": reason}, headers=env.admin)
    assert words in _problem(r, "reason")
    assert env.client.get("/v1/nodes", headers=env.admin).json()["items"][0]["health"] != "Cordoned"


def test_a_cordon_reason_is_kept_without_its_outer_whitespace(env: Env) -> None:
    r = env.client.post("/v1/nodes/n0/cordon", json={"reason": "  disk failing  "}, headers=env.admin)
    assert r.status_code == 200, r.text
    assert any(e.message.endswith("disk failing") for e in env.plane.store.events())


# --------------------------------------------------------------------------- log responses: bounded pieces and count


async def _log_call(app: Any, path: str, query: str, token_header: dict[str, str], sent: list[dict[str, Any]]) -> None:
    """Drive the ASGI app as a client that stays connected and never signals a disconnect
    (a slow or idle reader); each message the app sends is kept in `sent`."""
    import asyncio

    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"authorization", token_header["Authorization"].encode())],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)


def _running_job(env: Env, who: dict[str, str]) -> str:
    job_id: str = submit(env, who)["id"]
    env.plane.step()
    record = env.plane.controller.book.get(job_id)
    assert record is not None
    env.engine.pending.append(JobStarted(job_id, record.attempt, "n0", env.engine.now, pid=1))
    env.plane.step()
    return job_id


@pytest.mark.parametrize("follow", [False, True], ids=["plain", "followed"])
def test_a_log_is_sent_in_bounded_pieces(env: Env, follow: bool) -> None:
    """Before: the whole log (up to 8 MiB) went to the transport in one piece, so each client
    that did not read held all of it in the server's memory (60 such clients: +700 MB)."""
    import asyncio

    from sluice.api.job_logs import LOG_CHUNK as piece

    job_id = _running_job(env, env.alice)
    text = "".join(f"line {i:07d} " + "x" * 80 + "\n" for i in range(12_000))  # about 1 MiB
    (env.engine.log_dir / f"{job_id}.log").write_text(text)
    app = create_app(env.plane)
    sent: list[dict[str, Any]] = []

    def body() -> bytes:
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    async def run() -> None:
        call = asyncio.create_task(
            _log_call(app, f"/v1/jobs/{job_id}/logs", "follow=true" if follow else "", env.alice, sent)
        )
        for _ in range(400):
            if len(body()) >= len(text) or call.done():
                break
            await asyncio.sleep(0.01)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)

    asyncio.run(run())
    assert sent[0]["status"] == 200
    pieces = [len(m.get("body", b"")) for m in sent if m["type"] == "http.response.body"]
    assert body().decode() == text
    assert max(pieces) <= piece, max(pieces)


@pytest.mark.parametrize("follow", [False, True], ids=["plain", "followed"])
def test_a_log_read_that_hangs_holds_up_only_its_own_response(
    env: Env, follow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: log files were read on the event loop, so one log on a hung file system (a Ray
    runs folder on NFS) stopped the API for every tenant until the read returned."""
    import asyncio
    import threading

    from sluice.api import job_logs

    mine, theirs = _running_job(env, env.alice), _running_job(env, env.bob)
    (env.engine.log_dir / f"{mine}.log").write_text("hello\n")
    gate, reading, waited_out = threading.Event(), threading.Event(), []
    real = job_logs.read_from

    def hung(path: Any, pos: int, size: int = job_logs.LOG_CHUNK) -> tuple[bytes, int]:
        reading.set()
        if not gate.wait(timeout=5):  # the hung read; 5 s so a regression fails, not hangs
            waited_out.append(True)
        return real(path, pos, size)

    monkeypatch.setattr(job_logs, "read_from", hung)
    app = create_app(env.plane)

    async def run() -> None:
        stuck: list[dict[str, Any]] = []
        call = asyncio.create_task(
            _log_call(app, f"/v1/jobs/{mine}/logs", "follow=true" if follow else "", env.alice, stuck)
        )
        while not reading.is_set():
            await asyncio.sleep(0.01)
        other: list[dict[str, Any]] = []
        bob = asyncio.create_task(_log_call(app, f"/v1/jobs/{theirs}", "", env.bob, other))
        for _ in range(300):
            if any(m["type"] == "http.response.body" for m in other):
                break
            await asyncio.sleep(0.01)
        assert other and other[0]["status"] == 200 and not waited_out, "bob waited for alice's read"
        gate.set()
        for t in (call, bob):
            t.cancel()
        await asyncio.gather(call, bob, return_exceptions=True)

    asyncio.run(run())


def test_reads_stuck_on_a_hung_file_system_count_against_the_tenants_log_slots(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain log read took its slot only after reading the files: on a hung file system each
    request held a worker thread without one, so a tenant's requests could take every thread
    (40) and stall every tenant's other routes (red team, session 20). The 17th is a 429 now."""
    import asyncio
    import threading

    from sluice.api import job_logs
    from sluice.api.routes import jobs as job_routes

    cap = job_routes.MAX_LOG_STREAMS_PER_TENANT
    mine = _running_job(env, env.alice)
    gate, stuck = threading.Event(), threading.Semaphore(0)
    real = job_logs.segments

    def hung(paths: Any, lines: Any) -> Any:
        stuck.release()
        gate.wait(timeout=10)
        return real(paths, lines)

    monkeypatch.setattr(job_logs, "segments", hung)
    app = create_app(env.plane)

    async def run() -> None:
        calls = []
        for _ in range(cap):
            sent: list[dict[str, Any]] = []
            calls.append(asyncio.create_task(_log_call(app, f"/v1/jobs/{mine}/logs", "", env.alice, sent)))
        for _ in range(cap):  # every one of them inside the hung read
            while not stuck.acquire(blocking=False):
                await asyncio.sleep(0.01)
        extra: list[dict[str, Any]] = []
        task = asyncio.create_task(_log_call(app, f"/v1/jobs/{mine}/logs", "", env.alice, extra))
        for _ in range(300):
            if extra or task.done():
                break
            await asyncio.sleep(0.01)
        gate.set()
        assert extra and extra[0]["status"] == 429, "a 17th stuck read was let in"
        for t in [*calls, task]:
            t.cancel()
        await asyncio.gather(*calls, task, return_exceptions=True)

    asyncio.run(run())


def test_a_tenant_may_hold_only_so_many_log_streams(env: Env) -> None:
    """Before: any number of followed logs, each polling its job every 0.25 s for as long as
    the client stayed: 3,000 idle followers of one tenant took another's request from 2 ms to
    0.7 s. Now the 17th open log response of one tenant is a 429; others are not affected."""
    import asyncio

    from sluice.api.routes import jobs as job_routes

    cap = getattr(job_routes, "MAX_LOG_STREAMS_PER_TENANT", 16)
    mine, theirs = _running_job(env, env.alice), _running_job(env, env.bob)
    app = create_app(env.plane)

    async def started(who: dict[str, str], job: str) -> tuple[asyncio.Task[None], list[dict[str, Any]]]:
        sent: list[dict[str, Any]] = []
        task = asyncio.create_task(_log_call(app, f"/v1/jobs/{job}/logs", "follow=true", who, sent))
        for _ in range(300):
            if sent or task.done():
                break
            await asyncio.sleep(0.01)
        return task, sent

    async def run() -> None:
        held = [await started(env.alice, mine) for _ in range(cap)]
        assert all(sent[0]["status"] == 200 for _, sent in held)
        task, sent = await started(env.alice, mine)
        assert sent[0]["status"] == 429 and task.done()
        assert b"already has" in sent[1]["body"]
        bob_task, bob_sent = await started(env.bob, theirs)
        assert bob_sent[0]["status"] == 200  # another tenant's streams are its own
        held[0][0].cancel()  # one of alice's clients goes away: its slot is free again
        await asyncio.gather(held[0][0], return_exceptions=True)
        again, again_sent = await started(env.alice, mine)
        assert again_sent[0]["status"] == 200
        for t in [*(t for t, _ in held[1:]), bob_task, again]:
            t.cancel()
        await asyncio.gather(*(t for t, _ in held[1:]), bob_task, again, return_exceptions=True)

    asyncio.run(run())


def test_a_page_of_jobs_ends_early_rather_than_carry_too_many_bytes(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thousand 1 MiB specs made a 1 GB page, built in memory (red-team 5): a page now ends
    once it would pass MAX_PAGE_BYTES, with a cursor, and every job still comes exactly once."""
    import sluice.api.pagination as pagination
    from sluice.api.routes import jobs as job_routes

    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", 20_000)
    monkeypatch.setattr(job_routes, "JOB_BATCH", 1)
    ids = [submit(env, env.alice, {**GOOD, "command": ["python", "train.py", "x" * 5000]})["id"] for _ in range(9)]
    fetched: list[int] = []
    list_jobs = env.plane.list_jobs

    def counted(*a: Any, **kw: Any) -> Any:
        out = list_jobs(*a, **kw)
        fetched.append(len(out))
        return out

    monkeypatch.setattr(env.plane, "list_jobs", counted)
    seen: list[str] = []
    cursor, pages = None, 0
    while True:
        r = env.client.get(
            "/v1/jobs", params={"limit": 1000, **({"cursor": cursor} if cursor else {})}, headers=env.alice
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert 1 <= len(body["items"]) <= 4  # (1024 + ~5 kB) each: three fit under 20 kB, never the nine
        seen += [j["id"] for j in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(set(seen)) == len(seen) and pages >= 3
    # ... and no page read all nine to send a few (red-team 6): at most a few past the budget
    assert sum(fetched) <= len(ids) + 2 * pages, fetched


def test_a_page_is_measured_in_the_bytes_it_sends_not_characters(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A control character is one character and six bytes of JSON (\\u0001): counted in
    characters, a page of such specs went out ~6x its byte budget (walkthrough of session 19)."""
    import json

    import sluice.api.pagination as pagination

    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", 20_000)
    for _ in range(6):
        submit(env, env.alice, {**GOOD, "command": ["python", "train.py", "\x01" * 5000]})
    r = env.client.get("/v1/jobs", params={"limit": 1000}, headers=env.alice)
    assert r.status_code == 200, r.text
    one = max(len(json.dumps(j, ensure_ascii=False).encode()) for j in r.json()["items"])
    # the budget, plus the one item a page always holds (about 31 kB here)
    assert len(r.content) <= 20_000 + one, (len(r.content), one, len(r.json()["items"]))


def test_a_page_counts_every_free_form_string_of_the_spec(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page budget counted argv, env, labels and workdir as sent, and a flat 1 kB for the
    rest: a checkpoint location of 1024 control characters is 6 kB of JSON, so a page of
    small jobs with such a location went out ~5x its byte budget."""
    import json

    import sluice.api.pagination as pagination

    monkeypatch.setattr(pagination, "MAX_PAGE_BYTES", 20_000)
    location = "ck" + "\x01" * 1000
    for _ in range(40):
        submit(env, env.alice, {**GOOD, "checkpoint": {"location": location}})
    r = env.client.get("/v1/jobs", params={"limit": 1000}, headers=env.alice)
    assert r.status_code == 200, r.text
    one = max(len(json.dumps(j, ensure_ascii=False).encode()) for j in r.json()["items"])
    assert len(r.content) <= 20_000 + one, (len(r.content), one, len(r.json()["items"]))


def test_a_tenant_may_have_at_most_max_unfinished_jobs(tmp_path: Path) -> None:
    """Nothing bounded a tenant's queued jobs: each is held in memory and judged every round,
    so one tenant's flood slowed every tenant's scheduling (red-team 5)."""
    settings = Settings(home=tmp_path / "home", max_unfinished_jobs_per_tenant=3)
    plane = ControlPlane(settings, SqlStore(settings.db_url), LoggingFakeEngine(log_dir=tmp_path), make_policy("kube"))
    tokens = plane.bootstrap_tenants()
    admin = plane.authenticate(tokens["admin"])
    _, alice = plane.create_tenant(admin, TenantSpec(name="alice"))
    _, bob = plane.create_tenant(admin, TenantSpec(name="bob"))
    try:
        with TestClient(create_app(plane)) as client:
            post = lambda who: client.post("/v1/jobs", json=GOOD, headers=bearer(who))  # noqa: E731
            ids = [post(alice).json()["id"] for _ in range(3)]
            r = post(alice)
            assert r.status_code == 409 and "max_unfinished_jobs_per_tenant 3" in r.json()["detail"], r.text
            assert post(bob).status_code == 201  # another tenant is not held by alice's count
            assert all(post(tokens["admin"]).status_code == 201 for _ in range(4))  # admins are not capped
            assert client.post(f"/v1/jobs/{ids[0]}/cancel", headers=bearer(alice)).status_code == 200
            assert post(alice).status_code == 201  # an ended job makes room
    finally:
        plane.store.close()


def test_all_replicas_of_a_gang_one_lookup_and_at_most_the_read_limit(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant may submit a gang of as many replicas as the engine allows (Ray: 256, at 0.01
    CPU each): `?all_replicas=true` looks their logs up in one call to an engine that has
    `replica_logs` (Ray: one listing of the runs folder, not one per rank), and one read of
    them all returns at most MAX_LOG_BYTES of the logs (each rank had at least a LOG_CHUNK:
    256 replicas read 16 MiB a request). Red team s22."""
    from sluice.api import job_logs

    monkeypatch.setattr(job_logs, "MAX_LOG_BYTES", 4 * job_logs.LOG_CHUNK)
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 0.1, "replicas": {"min": 8}}})
    url = f"/v1/jobs/{job['id']}/logs"
    paths = []
    for k in range(8):
        p = env.engine.log_dir / f"big-r{k}.log"
        p.write_bytes((b"x" * 99 + b"\n") * 1024)  # 100 KiB a replica
        paths.append(str(p))
    one_by_one: list[int] = []
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: one_by_one.append(k))
    monkeypatch.setattr(env.engine, "replica_logs", lambda jid, world: paths[:world], raising=False)
    r = env.client.get(url, params={"all_replicas": "true"}, headers=env.alice)
    assert r.status_code == 200 and one_by_one == []
    ranks = {line.split(b"] ", 1)[0] for line in r.content.splitlines()}
    sent = sum(len(line.split(b"] ", 1)[1]) + 1 for line in r.content.splitlines())  # without the prefixes
    assert len(ranks) == 8 and 0 < sent <= job_logs.MAX_LOG_BYTES, sent


def test_a_cpu_in_millicores_past_a_float_is_a_422_not_a_500(env: Env) -> None:
    body = {**GOOD, "resources": {"cpu": "9" * 400 + "m"}}
    r = env.client.post("/v1/jobs", json=body, headers=env.alice)
    assert r.status_code == 422, r.text
    assert r.json()["problems"][0]["field"] == "resources.cpu"


def gang_in_its_second_attempt(env: Env) -> dict[str, Any]:
    """Alice's two-replica job, its first attempt failed (retryable) and the second placed."""
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 1, "replicas": {"min": 2}}})
    env.plane.step()
    env.engine.pending.append(JobStarted(job["id"], 1, "n0", env.engine.now, pid=1))
    env.plane.step()
    env.engine.pending.append(JobExited(job["id"], 1, env.engine.now, 1, retryable=True))
    env.plane.step()
    env.engine.now += 3600
    env.plane.step()
    assert env.plane.controller.book.get(job["id"]).attempt == 2
    return job


def test_every_replicas_log_is_of_the_newest_attempt_where_a_node_ran_an_earlier_one(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Ray a replica's log is `<job>--r<k>of<N>/job.log` on its node: a gang whose rank 0 ran
    on node A in attempt 1 and again in attempt 2 has both attempts in that one file. The
    all-replicas view ("every replica's output of the newest attempt") showed attempt 1's
    lines among attempt 2's, and a follower whose rank 0 moved on to such a log read it from
    its start; the agents' index beside the log says where attempt 2 starts."""
    from sluice.model.runfolder import JOB_LOG_INDEX

    job = gang_in_its_second_attempt(env)
    folders = [env.engine.log_dir / "a", env.engine.log_dir / "r1"]
    for f in folders:
        f.mkdir()
    ranks = [f / "job.log" for f in folders]
    ranks[0].write_text("one\ntwo\n")  # attempt 1's line, then attempt 2's
    (folders[0] / JOB_LOG_INDEX).write_text("1 0\n2 4\n")
    ranks[1].write_text("x\n")
    (folders[1] / JOB_LOG_INDEX).write_text("2 0\n")
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(ranks[k]))
    url = f"/v1/jobs/{job['id']}/logs"
    newest = "[rank0] two\n[rank1] x\n"
    assert env.client.get(url, params={"all_replicas": "true"}, headers=env.alice).text == newest
    assert env.client.get(url, params={"all_replicas": "true", "tail": 5}, headers=env.alice).text == newest

    calls = []

    def replica_logs(caller: object, job_id: str) -> list[Path | None]:
        calls.append(job_id)
        if len(calls) == 1:
            return [None, ranks[1]]  # rank 0's log not found yet
        env.engine.pending.append(JobExited(job["id"], 2, env.engine.now, 0))
        env.plane.step()
        return list(ranks)

    monkeypatch.setattr(env.plane, "replica_logs", replica_logs)
    with env.client.stream("GET", url, params={"all_replicas": "true", "follow": "true"}, headers=env.alice) as r:
        got = "".join(r.iter_text())
    assert sorted(got.splitlines()) == ["[rank0] two", "[rank1] x"], got


def test_a_followed_view_of_many_replicas_holds_a_bounded_amount_of_their_partial_lines(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank's partial line is held until it ends, up to LONGEST_LINE (64 KiB) a rank: a
    followed view of a 1,024-replica gang whose ranks each print 63 KiB without a newline
    made the server hold 64 MiB for one request, 1 GiB for a tenant's 16. Now the ranks of
    one followed view share FOLLOW_HELD_BYTES; a longer partial line goes out in pieces."""
    from sluice.api import job_logs
    from sluice.api.routes import jobs

    world = 8  # what the fake engine runs; the bound made smaller to match
    FOLLOW_HELD_BYTES = world * 16 * 1024
    monkeypatch.setattr(jobs, "FOLLOW_HELD_BYTES", FOLLOW_HELD_BYTES)
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": 0.5, "replicas": {"min": world}}})
    env.plane.step()
    attempt = env.plane.controller.book.get(job["id"]).attempt
    env.engine.pending.append(JobExited(job["id"], attempt, env.engine.now, 0))
    env.plane.step()
    ranks = [env.engine.log_dir / f"r{k}.log" for k in range(world)]
    line = 2 * FOLLOW_HELD_BYTES // world  # each rank's one unended line: twice its share
    for r in ranks:
        r.write_bytes(b"x" * line)
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(ranks[k]))
    held: dict[int, int] = {}
    most = [0]

    class Counted(job_logs.LinePrefixer):
        def feed(self, chunk: bytes) -> bytes:
            out = super().feed(chunk)
            held[id(self)] = len(self._held)
            most[0] = max(most[0], sum(held.values()))
            return out

    monkeypatch.setattr(job_logs, "LinePrefixer", Counted)
    url = f"/v1/jobs/{job['id']}/logs"
    with env.client.stream("GET", url, params={"all_replicas": "true", "follow": "true"}, headers=env.alice) as r:
        got = b"".join(r.iter_bytes())
    assert got.count(b"x") == world * line  # every byte, in pieces
    assert most[0] <= FOLLOW_HELD_BYTES, most[0]


def test_one_replicas_log_is_of_the_newest_attempt_where_its_node_ran_an_earlier_one(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`?replica=K` ("only this replica's output, of the newest attempt") read the rank's whole
    log on its node, which also holds the earlier attempts that ran that rank there."""
    from sluice.model.runfolder import JOB_LOG_INDEX

    job = gang_in_its_second_attempt(env)
    folder = env.engine.log_dir / "a"
    folder.mkdir()
    log = folder / "job.log"
    log.write_text("one\ntwo\n")  # attempt 1's line, then attempt 2's
    (folder / JOB_LOG_INDEX).write_text("1 0\n2 4\n")
    monkeypatch.setattr(env.engine, "logs_per_replica", True, raising=False)
    monkeypatch.setattr(env.engine, "replica_log", lambda jid, k: str(log))
    url = f"/v1/jobs/{job['id']}/logs"
    assert env.client.get(url, params={"replica": 1}, headers=env.alice).text == "two\n"
    assert env.client.get(url, params={"replica": 1, "tail": 5}, headers=env.alice).text == "two\n"
    (folder / JOB_LOG_INDEX).write_text("1 0\n")  # attempt 2 has no record there yet: nothing of it
    assert env.client.get(url, params={"replica": 1}, headers=env.alice).text == ""

    def finish() -> None:
        with log.open("a") as f:
            f.write("three\n")
        (folder / JOB_LOG_INDEX).write_text("1 0\n2 8\n")
        env.engine.pending.append(JobExited(job["id"], 2, env.engine.now, 0))
        env.plane.step()

    with env.client.stream("GET", url, params={"replica": 1, "follow": "true"}, headers=env.alice) as r:
        finisher = threading.Thread(target=finish)
        finisher.start()
        got = "".join(r.iter_text())
    finisher.join()
    assert got == "three\n", got


def test_a_followed_attempt_whose_start_was_never_recorded_is_still_shown(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent records where an attempt starts in its log before the attempt's first byte; a
    record it could not write (a full disk) left a follower of a job that moved to another
    node's log waiting for the record for the whole attempt, showing none of it. After a few
    looks at a grown log it reads from where that log stood when it first looked."""
    from sluice.api import job_logs
    from sluice.api.routes import jobs as job_routes
    from sluice.model.runfolder import JOB_LOG_INDEX

    monkeypatch.setattr(job_logs, "RECORD_WAIT_LOOKS", 2)
    monkeypatch.setattr(job_routes, "FOLLOW_POLL_S", 0.01)
    job = gang_in_its_second_attempt(env)
    a, b = env.engine.log_dir / "a", env.engine.log_dir / "b"
    for folder, text, attempt in ((a, "one\n", 2), (b, "zero\n", 1)):
        folder.mkdir()
        (folder / "job.log").write_text(text)
        (folder / JOB_LOG_INDEX).write_text(f"{attempt} 0\n")  # attempt 1 ran on b
    looks: list[int] = []

    def log_path(caller: object, job_id: str) -> Path:
        looks.append(1)
        if len(looks) == 1:
            return a / "job.log"
        if len(looks) == 3:  # attempt 2 writes on b: its start was never recorded there
            with open(b / "job.log", "a") as f:
                f.write("two\n")
        if len(looks) == 4:
            env.engine.pending.append(JobExited(job["id"], 2, env.engine.now, 0))
            env.plane.step()
        return b / "job.log"

    monkeypatch.setattr(env.plane, "log_path", log_path)
    with env.client.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}, headers=env.alice) as r:
        assert "".join(r.iter_text()) == "one\ntwo\n"  # not attempt 1's "zero", and not nothing


def test_after_names_only_the_callers_own_jobs_and_none_that_failed(env: Env) -> None:
    """`after` is checked at submit: another tenant's job reads as no such job (the words
    `resume_from` uses, so bob learns nothing of alice's ids), and a job that already ended
    other than Succeeded is a 409 (the new job could never start); nothing is created."""
    alices = submit(env, env.alice)
    bobs = submit(env, env.bob)
    r = env.client.post("/v1/jobs", json={**GOOD, "after": [bobs["id"], "j-nope"]}, headers=env.alice)
    assert r.status_code == 422, r.text
    assert r.json()["problems"] == [
        {"field": "after.0", "problem": f"you have no job or job array {bobs['id']!r}"},
        {"field": "after.1", "problem": "you have no job or job array 'j-nope'"},
    ]
    r = env.client.post(f"/v1/jobs/{alices['id']}/cancel", headers=env.alice)
    assert r.status_code < 300, r.text
    env.plane.step()
    r = env.client.post("/v1/jobs", json={**GOOD, "after": [alices["id"]]}, headers=env.alice)
    assert r.status_code == 409 and f"after: job {alices['id']} ended Cancelled" in r.text
    for bad in ([alices["id"]] * 2, "x", [1]):
        assert env.client.post("/v1/jobs", json={**GOOD, "after": bad}, headers=env.alice).status_code == 422
    listed = env.client.get("/v1/jobs", headers=env.alice).json()
    assert len(listed["items"] if isinstance(listed, dict) else listed) == 1  # only the cancelled one
    ok = submit(env, env.alice, {**GOOD, "after": [submit(env, env.alice)["id"]]})
    assert env.client.get(f"/v1/jobs/{ok['id']}", headers=env.alice).json()["spec"]["after"]


def test_usage_is_each_tenants_own_and_every_tenants_for_an_admin(env: Env) -> None:
    """GET /v1/usage: what jobs held (GPU-hours; guaranteed core-hours without GPUs) and ran,
    by tenant. A tenant sees its own and is refused another's; an admin sees all."""
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": {"min": 2, "max": 2}}})
    submit(env, env.bob)
    env.plane.step()
    env.engine.pending.append(JobStarted(job["id"], 1, "n0", env.engine.now, pid=1))
    env.plane.step()
    for _ in range(10):
        env.engine.now += 36
        env.plane.step()
    env.plane.controller.book.flush(force=True)
    env.plane.controller.flush_held_time(force=True)
    mine = env.client.get("/v1/usage", headers=env.alice).json()
    assert [u["tenant"] for u in mine] == ["alice"]
    assert mine[0]["jobs"] == 1 and mine[0]["phases"] == {"Running": 1}
    assert mine[0]["core_hours"] == pytest.approx(0.2) and mine[0]["run_hours"] == pytest.approx(0.1)
    assert mine[0]["gpu_hours"] == 0
    assert env.client.get("/v1/usage", params={"tenant": "bob"}, headers=env.alice).status_code == 403
    every = env.client.get("/v1/usage", headers=env.admin).json()
    assert [u["tenant"] for u in every] == ["alice", "bob"]
    assert env.client.get("/v1/usage", params={"all": "true"}, headers=env.admin).json() == every
    r = env.client.get("/v1/usage", params={"all": "true"}, headers=env.alice)  # was alice's own, a 200
    assert r.status_code == 403 and "admin token" in r.text, r.text
    later = env.client.get("/v1/usage", params={"since": env.engine.now + 3600}, headers=env.admin).json()
    assert later == []
    one = env.client.get("/v1/usage", params={"tenant": "bob"}, headers=env.admin).json()
    assert [u["tenant"] for u in one] == ["bob"]
    for bad in ("nan", "inf", "x"):
        assert env.client.get("/v1/usage", params={"since": bad}, headers=env.alice).status_code == 422
    assert env.client.get("/v1/usage", params={"tenant": "x" * 64}, headers=env.admin).status_code == 422


def test_usage_in_a_window_charges_the_hours_held_in_it_not_the_day_a_job_was_submitted(env: Env) -> None:
    """A job submitted before the window that ran into it is charged the hours it held in the
    window; a job is counted (jobs, phases) in the window it was submitted in. Before, a window
    summed what its submitted jobs held in all: a job that ran all week read 0 for `--since 1d`."""
    hour = 3600.0
    env.engine.now = 10 * hour + 1000.0
    job = submit(env, env.alice, {**GOOD, "resources": {"cpu": {"min": 1, "max": 1}}})
    env.plane.step()
    env.engine.pending.append(JobStarted(job["id"], 1, "n0", env.engine.now, pid=1))
    env.plane.step()
    start = env.engine.now
    while env.engine.now < start + 3 * hour:  # three hours in steps across the hours' turns
        env.engine.now += 360
        env.plane.step()
    env.plane.controller.flush_held_time(force=True)
    ran = env.engine.now - start
    whole = env.client.get("/v1/usage", headers=env.alice).json()[0]
    assert whole["jobs"] == 1 and whole["core_hours"] == pytest.approx(ran / hour)
    window = env.client.get("/v1/usage", params={"since": 12 * hour}, headers=env.alice).json()[0]
    assert window["jobs"] == 0 and window["phases"] == {}  # submitted before it
    assert window["core_hours"] == pytest.approx((env.engine.now - 12 * hour) / hour)
    assert window["run_hours"] == pytest.approx((env.engine.now - 12 * hour) / hour)
