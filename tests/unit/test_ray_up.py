"""`sluice up` and the Ray engine's address (walk4 D4, D6, D8), without a Ray cluster: the
address is checked and said before anything starts, an address nobody answers at fails in
seconds, a detached server that never answers is stopped, and a home whose running jobs another
engine placed refuses to start with this one (they would run twice)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sluice.cli import up as up_cli
from sluice.control.engine_record import (
    EngineMismatch,
    EngineRecord,
    check_engine,
    intended,
    read_record,
    write_record,
)
from sluice.engine.ray_connect import RayUnreachable, check_reachable, resolve_address
from sluice.model import Allocation, JobRecord, Phase
from sluice.server import pid_alive
from sluice.settings import Settings, check_ray_address
from sluice.spec import JobSpec
from sluice.store.sql import SqlStore

from ..live_api import run_cli as sluice


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("10.0.0.5:6379", ("gcs", "10.0.0.5", 6379)),
        ("head.example:1", ("gcs", "head.example", 1)),
        ("[::1]:6379", ("gcs", "::1", 6379)),
        ("ray://10.0.0.5:10001", ("client", "10.0.0.5", 10001)),
        ("ray://head", ("client", "head", 10001)),
        ("local", ("local", "", None)),
    ],
)
def test_a_ray_address_is_a_host_and_a_port(text: str, want: tuple[str, str, int | None]) -> None:
    assert check_ray_address(text) == want


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("127.0.0.1:99999", "from 1 to 65535"),
        ("127.0.0.1:0", "from 1 to 65535"),
        ("notahost:abc", "from 1 to 65535"),
        ("10.0.0.5", "is not a Ray address"),
        (":6379", "is not a Ray address"),
        ("http://10.0.0.5:6379", "unknown scheme"),
        ("auto", "whichever Ray cluster"),
    ],
)
def test_a_bad_ray_address_is_one_line_saying_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as err:
        check_ray_address(text)
    assert "\n" not in str(err.value)


def test_ray_address_comes_from_the_setting_then_ray_address_and_says_so() -> None:
    assert resolve_address("10.0.0.5:6379", {"RAY_ADDRESS": "10.0.0.9:6379"}) == ("10.0.0.5:6379", "ray_address")
    assert resolve_address(None, {"RAY_ADDRESS": "10.0.0.9:6379"}) == ("10.0.0.9:6379", "RAY_ADDRESS")
    assert resolve_address(None, {}) == (None, "")
    assert resolve_address("local", {"RAY_ADDRESS": "10.0.0.9:6379"}) == (None, "")
    assert resolve_address(None, {"RAY_ADDRESS": "local"}) == (None, "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_nobody_answers_at_fails_in_one_line() -> None:
    port = _free_port()
    with pytest.raises(RayUnreachable, match=rf"^cannot reach the Ray cluster at 127.0.0.1:{port}: "):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)
    with pytest.raises(RayUnreachable, match="not a Ray address"):
        check_reachable("127.0.0.1:99999")
    with _server(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00") as port:  # an HTTP/2 SETTINGS frame, as gRPC opens
        check_reachable(f"ray://127.0.0.1:{port}", timeout_s=2.0)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n", "answered 'HTTP/1.1 400 Bad Request'"),
        (b"", "answered 'nothing'"),
        (None, "no answer within 1 s"),
    ],
)
def test_a_port_that_is_not_ray_is_refused_in_seconds(answer: bytes | None, says: str) -> None:
    """`--address` naming sluice's own API port (or any web server) made ray.init retry for
    minutes: the check now wants gRPC's HTTP/2 answer, not only an open port."""
    with _server(answer) as port, pytest.raises(RayUnreachable, match=rf"127.0.0.1:{port}.*{re.escape(says)}"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=1.0)


@contextlib.contextmanager
def _server(answer: bytes | None) -> Iterator[int]:
    """A fake peer on loopback (a stand-in for a server that is or is not Ray): it reads what
    comes, then sends `answer` and closes (None: says nothing and holds the connection)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = listening.accept()
        with conn:
            conn.recv(64)
            if answer is None:
                done.wait(5)
            else:
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listening.getsockname()[1])
    finally:
        done.set()
        thread.join(5)
        listening.close()


def test_up_checks_the_address_flag_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for bad in ("127.0.0.1:99999", "notahost:abc", "ray://"):
        code, _, err = sluice("up", "--engine", "ray", "--address", bad)
        assert code == 2 and err.startswith("error: --address: ") and err.count("\n") == 1, err
    code, _, err = sluice("up", "--engine", "local", "--address", "10.0.0.5:6379")
    assert code == 2 and "--address" in err and "--engine ray" in err
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:99999")
    code, _, err = sluice("up", "--engine", "ray")
    assert code == 2 and err.startswith("error: RAY_ADDRESS: "), err
    assert not (tmp_path / "home" / "server.json").exists()


def test_up_detach_stops_the_server_it_gave_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that never answers (stuck joining a cluster, ignoring SIGTERM) is killed when
    `up --detach` gives up: nothing is left running that no server.json names."""
    pid_file = tmp_path / "child.pid"
    stuck = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    monkeypatch.setattr(up_cli, "SERVER_COMMAND", [sys.executable, "-c", stuck])
    monkeypatch.setattr(up_cli, "UP_TIMEOUT_S", 2.0)
    monkeypatch.setattr(up_cli, "STOP_CHILD_S", 1.0)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    code, _, err = sluice("up", "--detach", "--port", "0")
    assert code == 1 and "did not answer within 2s and was stopped" in err, err
    pid = int(pid_file.read_text())
    assert not pid_alive(pid)


def _home_with_running_jobs(home: Path, nodes: list[str]) -> Settings:
    home.mkdir(parents=True)
    settings = Settings(home=home)
    store = SqlStore(settings.db_url)
    try:
        spec = JobSpec.model_validate({"name": "mlp", "command": ["python", "mlp.py"]})
        for i, node in enumerate(nodes):
            job = JobRecord(id=f"j-{i}", tenant="default", spec=spec, submitted_at=float(i))
            store.create_job(job)
            store.save_job(replace(job, phase=Phase.RUNNING, attempt=1, allocation=Allocation.single(node)))
        done = JobRecord(id="j-done", tenant="default", spec=spec, submitted_at=9.0)
        store.create_job(done)
        store.save_job(replace(done, phase=Phase.SUCCEEDED, attempt=1))
    finally:
        store.close()
    return settings


def test_a_home_whose_running_jobs_ray_placed_refuses_the_local_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    home = tmp_path / "home"
    settings = _home_with_running_jobs(home, ["n0", "n1", "n2"])
    write_record(home, EngineRecord("ray", "10.0.0.1:6379", "sluice", jobs_outlive_plane=True))
    with pytest.raises(EngineMismatch) as err:
        check_engine(settings)
    assert str(err.value) == (
        "this home's 3 running jobs were placed by the ray engine at 10.0.0.1:6379, not the local engine; "
        "start with `sluice up --engine ray --address 10.0.0.1:6379`, or cancel them there first (they would run twice)"
    )
    # Another cluster, or the same one under another namespace, is refused too; the same is not.
    with pytest.raises(EngineMismatch, match=re.escape("not the ray engine at 10.0.0.2:6379")):
        check_engine(settings.model_copy(update=dict(engine="ray", ray_address="10.0.0.2:6379")))
    with pytest.raises(
        EngineMismatch,
        match=re.escape(
            "namespace other-ns), not the ray engine at 10.0.0.1:6379 (namespace sluice); "
            "start with `SLUICE_RAY_NAMESPACE=other-ns sluice up"
        ),
    ):
        write_record(home, EngineRecord("ray", "10.0.0.1:6379", "other-ns"))
        check_engine(settings.model_copy(update=dict(engine="ray", ray_address="10.0.0.1:6379")))
    write_record(home, EngineRecord("ray", "10.0.0.1:6379", "sluice"))
    check_engine(settings.model_copy(update=dict(engine="ray", ray_address="10.0.0.1:6379")))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # joined through RAY_ADDRESS: the same cluster
    check_engine(settings.model_copy(update=dict(engine="ray")))

    # The CLI says it in one line, exit 1, and starts nothing (the jobs stay as they were).
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv("SLUICE_HOME", str(home))
    code, _, err = sluice("up", "--detach", "--port", "0")
    assert code == 1 and err.startswith("error: this home's 3 running jobs were placed by the ray engine"), err
    assert err.count("\n") == 1 and not (home / "server.json").exists()
    store = SqlStore(settings.db_url)
    try:
        assert [j.phase for j in store.list_jobs()] == [Phase.RUNNING] * 3 + [Phase.SUCCEEDED]
    finally:
        store.close()


def test_jobs_that_stopped_with_the_plane_or_no_running_jobs_do_not_refuse(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = _home_with_running_jobs(home, ["vm"])
    check_engine(settings)  # no record (a home from before records): nothing to go by
    write_record(home, EngineRecord("ray", None, "sluice", jobs_outlive_plane=False))
    check_engine(settings)  # a Ray instance the plane started stopped with it, and its jobs too
    write_record(home, EngineRecord("local"))
    with pytest.raises(EngineMismatch, match=r"1 running job was placed by the local engine, not the ray engine"):
        check_engine(settings.model_copy(update=dict(engine="ray", ray_address="10.0.0.1:6379")))
    assert read_record(home) == EngineRecord("local")
    empty = Settings(home=tmp_path / "other")
    (tmp_path / "other").mkdir()
    write_record(empty.home, EngineRecord("ray", "10.0.0.1:6379", "sluice"))
    SqlStore(empty.db_url).close()
    check_engine(empty)  # nothing running: any engine may start


def test_up_asked_for_another_engine_than_the_running_server_s_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Walkthrough s30: with a plane on the Ray cluster at 192.0.2.2:16390, `sluice up --engine
    # ray --address ray://other:10001` (or `--engine local`) answered "sluice is already
    # running at ..." and exit 0, as if it ran what was asked.
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    running = {"pid": os.getpid(), "url": "http://127.0.0.1:1", "engine": "ray"}
    (home / "server.json").write_text(json.dumps({**running, "ray_address": "10.0.0.1:6379"}))
    code, out, err = sluice("up", "--engine", "ray", "--address", "ray://10.0.0.2:10001")
    assert code == 1 and err == (
        f"error: sluice is already running at http://127.0.0.1:1 (pid {running['pid']}) with the ray engine at "
        "10.0.0.1:6379, not the ray engine at ray://10.0.0.2:10001; `sluice down` first to change it\n"
    ), err
    code, _, err = sluice("up", "--engine", "local")
    assert code == 1 and "with the ray engine at 10.0.0.1:6379, not the local engine;" in err
    code, _, err = sluice("up", "--engine", "ray")  # no address: a one-node instance of its own
    assert code == 1 and "not the ray engine's own one-node instance;" in err
    for same in (("--engine", "ray", "--address", "10.0.0.1:6379"), ()):  # what runs, or not asked
        code, out, err = sluice("up", *same)
        assert code == 0 and out.startswith("sluice is already running") and err == "", (same, err)


def test_what_a_plane_would_run_resolves_ray_address(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert intended(Settings(home=tmp_path, engine="ray")) == EngineRecord("ray", "10.0.0.9:6379", "sluice")
    assert intended(Settings(home=tmp_path, engine="local")) == EngineRecord("local")
