"""The CLI (typer's CliRunner, in-process) against a live API server on a free loopback port.

The server is the real FastAPI app and ControlPlane over SqlStore, run by uvicorn in a
thread; its engine is the FakeEngine of tests/unit/fake_engine.py (a fake: these tests are
about the CLI's contract — exit codes, messages, `-o json` — not processes). The URL and
tokens are found the way a user's CLI finds them: $SLUICE_HOME/server.json and token files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.control.plane import ControlPlane
from sluice.model import JobExited, JobProgress, JobStarted, JobUsage, Phase
from sluice.policy import make_policy
from sluice.settings import Settings
from sluice.spec import TenantSpec
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
    settings = Settings(home=home)
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


runner = CliRunner()


sluice = run_cli


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


GOOD_SPEC = """
name: mnist
command: [python, train.py, --epochs, "3"]
resources:
  cpu: {min: 1, max: 2}
"""


def test_submit_list_get_why_cancel(live: Live, tmp_path: Path) -> None:
    code, out, err = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))
    assert code == 0, err
    job_id = out.strip()
    stored = live.plane.store.get_job(job_id)
    assert stored is not None and stored.tenant == "default" and stored.spec.workdir == str(tmp_path)

    code, out, _ = sluice("job", "list", "-o", "json")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [job_id]
    code, out, _ = sluice("job", "list")
    assert code == 0 and job_id in out and "Pending" in out

    live.plane.step()
    code, out, _ = sluice("job", "get", job_id, "-o", "json")
    assert code == 0 and json.loads(out)["phase"] == "Starting"
    code, out, _ = sluice("job", "list", "--phase", "Queued", "-o", "json")
    assert code == 0 and json.loads(out) == []

    code, out, _ = sluice("job", "why", job_id, "-o", "json")
    events = json.loads(out)
    assert code == 0 and events[0]["kind"] == "phase" and events[0]["job_id"] == job_id
    code, out, _ = sluice("job", "why", job_id)
    assert code == 0 and "submitted by tenant default" in out and "kube: fits on" in out

    code, out, _ = sluice("job", "cancel", job_id)
    assert code == 0 and "Stopping" in out and "cancelled by tenant default" in out
    live.engine.pending.append(JobExited(job_id, live.plane.controller.book.get(job_id).attempt, live.engine.now, -15))
    live.plane.step()
    assert live.plane.store.get_job(job_id).phase == Phase.CANCELLED  # type: ignore[union-attr]
    code, _, err = sluice("job", "cancel", job_id)
    assert code == 1 and "already Cancelled" in err


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (GOOD_SPEC + "max_restart: 2\n", "max_restart"),
        ("command: python train.py\n", "command"),
        ("name: x\nresources: {cpu: -1}\n", "resources.cpu.min"),
        ("name: x\n", "command"),
        ("command: [python\n", "(spec)"),
        ("command: [x]\nresources: {cpu: {min: true, max: 1}}\n", "resources.cpu.min"),
        ("command: [x]\npriority: 1\npriority: 2\n", "(spec)"),
    ],
    ids=["unknown-field", "shell-string", "negative-cpu", "missing-command", "bad-yaml", "bool-cpu", "duplicate-key"],
)
def test_bad_spec_file_exits_2_naming_the_field(live: Live, tmp_path: Path, text: str, field: str) -> None:
    code, out, err = sluice("job", "submit", str(write_spec(tmp_path / "bad.yaml", text)))
    assert code == 2
    assert f"  {field}:" in err
    assert out == ""
    assert live.plane.store.list_jobs() == []


def test_missing_spec_file_exits_2(live: Live, tmp_path: Path) -> None:
    code, _, err = sluice("job", "submit", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read" in err


def test_bad_argument_exits_2(live: Live) -> None:
    code, _, err = sluice("job", "list", "--phase", "Sleeping")
    assert code == 2 and "Sleeping" in err
    code, _, err = sluice("job", "list", "-o", "yaml")
    assert code == 2


def test_unreachable_server_exits_1_with_a_clear_message(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_URL", f"http://127.0.0.1:{free_port()}")
    code, _, err = sluice("job", "list")
    assert code == 1 and "cannot reach the sluice server" in err and "SLUICE_URL's" in err


def test_unreachable_without_a_server_file_says_the_address_is_only_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `sluice down` the home has no server.json, so the CLI tries the settings' port,
    which need not be the one the plane ran on (walk s30): the message says so."""
    monkeypatch.delenv("SLUICE_URL", raising=False)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_PORT", str(free_port()))
    code, _, err = sluice("job", "list")
    assert code == 1 and "cannot reach the sluice server" in err
    assert "no sluice server of" in err and "server.json" in err and "SLUICE_URL" in err and "sluice up" in err


def test_bad_token_and_other_tenants_job(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, out, _ = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))
    job_id = out.strip()
    monkeypatch.setenv("SLUICE_TOKEN", "slc_not-a-token")
    code, _, err = sluice("job", "list")
    assert code == 1 and "not authenticated" in err
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    code, _, err = sluice("job", "get", job_id)
    assert code == 1 and f"job {job_id} not found" in err
    code, _, err = sluice("tenant", "list")
    assert code == 1 and "not allowed" in err


def test_every_job_command_names_a_missing_job_alike_and_quotes_what_is_no_job_id(live: Live) -> None:
    """`job 'j-1' not found` from why and cancel against `job j-1 not found` from get and files
    (walk s30): one wording now, with a text no job id can have quoted, control characters shown."""
    for command in ("get", "why", "cancel", "logs", "files", "delete", "suspend"):
        code, _, err = sluice("job", command, "j-nosuch")
        assert code == 1 and "job j-nosuch not found" in err, (command, err)
        code, _, err = sluice("job", command, "j-\x1b[2Jx")
        assert code != 0 and "\x1b" not in err and "'j-\\x1b[2Jx'" in err, (command, err)


def test_on_the_planes_machine_another_tenants_job_is_reached_with_the_admin_token(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's CLI holds the default tenant's token: `job cancel ID` of bob's job said
    "not found" while `tenant delete bob` told the operator to run exactly that (ops walk s31).
    With admin.token readable and no SLUICE_TOKEN, a job the own token does not see is asked
    again as the admin; bob himself still sees only his own."""
    spec = str(write_spec(tmp_path / "job.yaml", GOOD_SPEC))
    mine = sluice("job", "submit", spec)[1].strip()
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    bobs = sluice("job", "submit", spec)[1].strip()
    code, _, err = sluice("job", "get", mine)
    assert code == 1 and f"job {mine} not found" in err  # bob: not his
    monkeypatch.delenv("SLUICE_TOKEN")
    code, out, err = sluice("job", "get", bobs, "-o", "json")
    assert code == 0 and json.loads(out)["tenant"] == "bob", err
    assert sluice("job", "why", bobs)[0] == 0
    code, out, err = sluice("job", "cancel", bobs)
    assert code == 0, err
    assert live.plane.store.get_job(bobs).phase == Phase.CANCELLED  # type: ignore[union-attr]
    code, out, _ = sluice("job", "get", mine, "-o", "json")  # one's own job: one's own view
    assert code == 0 and json.loads(out)["tenant"] == "default"
    (live.home / "admin.token").unlink()  # not the plane's machine (or not its operator)
    code, _, err = sluice("job", "get", bobs)
    assert code == 1 and f"job {bobs} not found" in err


def test_cancel_several_goes_on_past_one_that_fails_and_reaches_no_other_tenants_job(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = str(write_spec(tmp_path / "job.yaml", GOOD_SPEC))
    mine = [sluice("job", "submit", spec)[1].strip() for _ in range(2)]
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    bobs = sluice("job", "submit", spec)[1].strip()
    # bob names the other tenant's job between two of his own: it is "not found" to him, stays
    # queued, and his own job after it is still cancelled; the exit code is the failure's
    code, out, err = sluice("job", "cancel", mine[0], bobs, bobs, "-o", "json")
    assert code == 1 and f"job {mine[0]} not found" in err and err.count("error:") == 1, err
    assert [j["id"] for j in json.loads(out)] == [bobs]  # named twice, cancelled once
    assert live.plane.store.get_job(mine[0]).phase == Phase.PENDING  # type: ignore[union-attr]
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["default"])
    code, out, err = sluice("job", "cancel", *mine)
    assert code == 0 and err == "" and [line.split(":")[0] for line in out.splitlines()] == mine, out
    assert {live.plane.store.get_job(j).phase for j in mine} == {Phase.CANCELLED}  # type: ignore[union-attr]
    code, out, _ = sluice("job", "cancel", mine[0], "-o", "json")  # one id: one object, as before
    assert code == 1 and out == ""
    # each failure is said, not only the first (the rest went unsaid, with the exit code right)
    code, out, err = sluice("job", "cancel", mine[0], "j-nosuch", mine[1])
    assert code == 1 and out == "" and err.count("error:") == 3, err
    assert f"{mine[0]} already Cancelled" in err and "j-nosuch" in err and f"{mine[1]} already Cancelled" in err
    code, _, err = sluice("job", "cancel", *(["j-x"] * 1001))
    assert code == 2 and "at most 1000" in err


def test_cancel_several_that_loses_the_server_says_which_were_cancelled(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server went away after the first of three ids: only 'cannot reach' was printed, so
    the user could not tell that the first job had been cancelled and the others not."""
    from sluice.client.api import Client, JobOut
    from sluice.client.errors import UnreachableError

    spec = str(write_spec(tmp_path / "job.yaml", GOOD_SPEC))
    ids = [sluice("job", "submit", spec)[1].strip() for _ in range(3)]
    real = Client.cancel
    calls: list[str] = []

    def cancel(self: Client, job_id: str) -> JobOut:
        calls.append(job_id)
        if len(calls) > 1:
            raise UnreachableError("cannot reach the sluice server at http://127.0.0.1:1")
        return real(self, job_id)

    monkeypatch.setattr(Client, "cancel", cancel)
    code, out, err = sluice("job", "cancel", *ids)
    assert code != 0 and "cannot reach" in err, err
    assert out.startswith(f"{ids[0]}: Cancelled"), out  # the one that was cancelled is said
    assert f"not cancelled: {ids[1]}, {ids[2]}" in err, err
    code, out, err = sluice("job", "cancel", *ids, "-o", "json")
    assert code != 0 and out == "" and f"not cancelled: {ids[0]}, {ids[1]}, {ids[2]}" in err, (out, err)


def test_logs(live: Live, tmp_path: Path) -> None:
    _, out, _ = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))
    job_id = out.strip()
    live.plane.step()
    attempt = live.plane.controller.book.get(job_id).attempt
    live.engine.pending.append(JobStarted(job_id, attempt, "n0", live.engine.now))
    live.plane.step()
    (tmp_path / f"{job_id}.log").write_text("step 1 loss 2.0\nstep 2 loss 1.5\n")
    code, out, _ = sluice("job", "logs", job_id)
    assert code == 0 and out == "step 1 loss 2.0\nstep 2 loss 1.5\n"
    live.engine.pending.append(JobExited(job_id, attempt, live.engine.now, 0))
    live.plane.step()
    code, out, _ = sluice("job", "logs", job_id, "-f")  # the job has ended: prints all and returns
    assert code == 0 and out == "step 1 loss 2.0\nstep 2 loss 1.5\n"


def test_job_list_filters_by_queue_and_tenant(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The client and the dashboard filter by queue and tenant; `job list` had only --phase.
    _, mine, _ = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    _, bobs, _ = sluice("job", "submit", str(write_spec(tmp_path / "bob.yaml", GOOD_SPEC)))
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["admin"])
    code, out, _ = sluice("job", "list", "--tenant", "bob", "-o", "json")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [bobs.strip()]
    code, out, _ = sluice("job", "list", "-q", "default", "-o", "json")
    assert code == 0 and {j["id"] for j in json.loads(out)} == {mine.strip(), bobs.strip()}
    code, out, _ = sluice("job", "list", "--queue", "research", "-o", "json")
    assert code == 0 and json.loads(out) == []
    code, out, err = sluice("job", "list", "--queue", "research", "-p", "running")  # a table: says so
    assert code == 0 and out == "" and err.strip() == "no jobs of that phase and queue", (out, err)


def test_job_list_filters_by_label(live: Live, tmp_path: Path) -> None:
    """Labels were accepted in a spec but nothing could select by them."""
    vision = write_spec(tmp_path / "v.yaml", GOOD_SPEC + "labels: {team: vision, stage: train}\n")
    _, a, _ = sluice("job", "submit", str(vision))
    _, b, _ = sluice("job", "submit", str(write_spec(tmp_path / "n.yaml", GOOD_SPEC + "labels: {team: nlp}\n")))
    _, c, _ = sluice("job", "submit", str(write_spec(tmp_path / "x.yaml", GOOD_SPEC)))
    code, out, _ = sluice("job", "list", "-l", "team=vision", "-o", "json")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [a.strip()]
    code, out, _ = sluice("job", "list", "-l", "team=vision", "--label", "stage=eval", "-o", "json")
    assert code == 0 and json.loads(out) == []  # every label given must match
    code, out, err = sluice("job", "list", "-l", "team=ops")
    assert code == 0 and err.strip() == "no jobs of that label"
    for bad in ("team", "=x"):
        code, _, err = sluice("job", "list", "-l", bad)
        assert code == 2 and "KEY=VALUE" in err
    code, _, err = sluice("job", "list", "-l", "team=a", "-l", "team=b")
    assert code == 2 and "two values" in err
    assert {b.strip(), c.strip()}.isdisjoint(
        j["id"] for j in json.loads(sluice("job", "list", "-l", "team=vision", "-o", "json")[1])
    )


def test_logs_of_a_job_with_no_output_say_why(live: Live, tmp_path: Path) -> None:
    # `sluice job logs` (and -f) of a job that never started printed nothing at all.
    _, out, _ = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))
    job_id = out.strip()
    code, out, err = sluice("job", "logs", job_id)
    assert code == 0 and out == "" and f"no output: job {job_id} is Pending" in err, err
    assert sluice("job", "cancel", job_id)[0] == 0
    code, out, err = sluice("job", "logs", "-f", job_id)
    assert code == 0 and out == "" and f"no output: job {job_id} is Cancelled — cancelled by tenant default" in err, err


def test_nodes(live: Live) -> None:
    code, out, _ = sluice("node", "list", "-o", "json")
    assert code == 0 and [n["name"] for n in json.loads(out)] == ["n0", "n1"]
    code, _, err = sluice("node", "cordon", "n0")
    assert code == 2 and "--reason" in err
    code, out, _ = sluice("node", "cordon", "n0", "--reason", "disk failing")
    assert code == 0 and "Cordoned" in out
    code, out, _ = sluice("node", "list")
    assert code == 0 and "disk failing" in out
    code, out, _ = sluice("node", "uncordon", "n0", "-o", "json")
    assert code == 0 and json.loads(out)["health"] == "Healthy"
    code, _, err = sluice("node", "cordon", "n9", "--reason", "x")
    assert code == 1 and "not found" in err


def test_cordon_says_which_jobs_move_and_warns_when_no_other_node_can_take_them(live: Live, tmp_path: Path) -> None:
    code, out, err = sluice("node", "cordon", "n1", "-r", "disk")
    assert code == 0 and "n1: Cordoned — disk" in out and "no running job to move" in out and not err
    job_id, _ = _running(live, tmp_path)  # the only schedulable node left is n0: it runs there
    code, out, err = sluice("node", "cordon", "n0", "-r", "disk")
    assert code == 0 and f"1 job(s) move off it through their checkpoints: {job_id}" in out
    assert "warning: no other node is schedulable, so the 1 job(s) will wait" in err
    assert live.plane.controller.book.get(job_id).phase == Phase.STOPPING
    assert sluice("node", "uncordon", "n1")[0] == 0
    code, out, _ = sluice("node", "cordon", "n0", "-r", "disk again", "-o", "json")
    got = json.loads(out)
    assert code == 0 and got["moved_jobs"] == [] and got["other_schedulable_nodes"] == 1  # already stopping
    code, out, err = sluice("node", "cordon", "n0", "-r", "disk, third time")
    assert code == 0 and "no running job to move" in out and "warning" not in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # a '/' would be decoded by the server into another route: refused here, named (exit 2)
        (("job", "get", "../../etc/passwd"), "job id '../../etc/passwd' may not contain '/'"),
        (("job", "why", "a/b"), "job id 'a/b' may not contain '/'"),
        (("dataset", "get", "../digits"), "dataset name '../digits' may not contain '/'"),
        (("job", "get", ".."), "job '..' not found"),  # sent as %2E%2E, not resolved away
        (("job", "get", "j-nope"), "not found"),
    ],
)
def test_a_missing_job_or_dataset_is_named_even_when_no_route_matched(
    live: Live, args: tuple[str, ...], words: str
) -> None:
    code, _, err = sluice(*args)
    assert code == (2 if "'/'" in words else 1) and words in err and "error: Not Found" not in err, err


def test_tenants(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = sluice("tenant", "create", "carol", "--max-running-jobs", "2", "-o", "json")
    assert code == 0
    created = json.loads(out)
    assert created["name"] == "carol" and created["token"].startswith("slc_")
    code, out, _ = sluice("tenant", "list", "-o", "json")
    assert code == 0 and [t["name"] for t in json.loads(out)] == ["admin", "bob", "carol", "default"]
    code, _, err = sluice("tenant", "create", "Bad Name")
    assert code == 2 and "name:" in err
    code, _, err = sluice("tenant", "create", "carol")
    assert code == 1 and "already exists" in err
    monkeypatch.setenv("SLUICE_TOKEN", created["token"])
    assert sluice("job", "list", "-o", "json")[0] == 0
    monkeypatch.delenv("SLUICE_TOKEN")
    code, out, _ = sluice("tenant", "delete", "carol")
    assert code == 0 and "deleted" in out
    monkeypatch.setenv("SLUICE_TOKEN", created["token"])
    assert sluice("job", "list")[0] == 1


def test_priority_classes(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = sluice("priority", "create", "high", "--value", "100", "--description", "urgent")
    assert code == 0 and "priority class high: value 100" in out
    code, _, err = sluice("priority", "create", "bad", "--value", "5000")
    assert code == 2 and "value" in err
    code, out, _ = sluice("priority", "list", "-o", "json")
    assert code == 0 and [(p["name"], p["value"]) for p in json.loads(out)] == [("high", 100)]
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    code, out, err = sluice("priority", "list")
    assert code == 0 and "high" in out, err  # tenants read the classes their jobs may name
    code, _, err = sluice("priority", "delete", "high")
    assert code == 1
    monkeypatch.delenv("SLUICE_TOKEN")
    code, out, _ = sluice("priority", "delete", "high")
    assert code == 0 and "deleted" in out
    code, _, err = sluice("priority", "delete", "high")
    assert code == 1 and "not found" in err


def test_submit_with_only_a_priority_class_or_the_default_class(live: Live, tmp_path: Path) -> None:
    assert sluice("priority", "create", "high", "--value", "100")[0] == 0
    code, out, err = sluice(
        "job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC + "priority_class: high\n"))
    )
    assert code == 0, err  # was exit 2: "priority: 0 contradicts priority_class 'high'"
    stored = live.plane.store.get_job(out.strip())
    assert stored is not None and (stored.spec.priority, stored.spec.priority_class) == (100, "high")
    assert sluice("priority", "create", "batch", "--value", "-5", "--default")[0] == 0
    code, out, err = sluice("job", "submit", str(write_spec(tmp_path / "plain.yaml", GOOD_SPEC)))
    stored = live.plane.store.get_job(out.strip())
    assert stored is not None and (stored.spec.priority, stored.spec.priority_class) == (-5, "batch"), err


def test_a_spec_only_the_server_can_refuse_is_named_like_a_local_refusal(live: Live, tmp_path: Path) -> None:
    """An unknown priority class passes the local check (classes live on the server): the
    refusal still names the file and the field, and exits 2 like a local one."""
    spec = write_spec(tmp_path / "job.yaml", GOOD_SPEC + "priority_class: no-such-class\n")
    code, _, err = sluice("job", "submit", str(spec))
    assert code == 2, err
    assert f"invalid job spec {spec} (refused by the server)" in err and "priority_class" in err, err


def test_duplicate_key_and_boolean_number_name_the_key_line_and_field(live: Live, tmp_path: Path) -> None:
    code, _, err = sluice(
        "job", "submit", str(write_spec(tmp_path / "a.yaml", "command: [x]\npriority: 1\npriority: 2\n"))
    )
    assert code == 2 and "line 3, column 1: duplicate key 'priority' (first at line 2)" in err
    code, _, err = sluice(
        "job", "submit", str(write_spec(tmp_path / "b.yaml", "command: [x]\nresources: {cpu: {min: true}}\n"))
    )
    assert code == 2 and "resources.cpu.min: expected a number, not true" in err
    assert live.plane.store.list_jobs() == []


@pytest.mark.parametrize(
    "args",
    [
        ["tenant", "create", "Bob"],
        ["queue", "create", "Research"],
        ["priority", "create", "High", "--value", "1"],
        ["job", "submit", "{dir}/job.yaml"],
        ["dataset", "create", "{dir}/data.yaml"],
    ],
    ids=["tenant", "queue", "priority-class", "job", "dataset"],
)
def test_a_bad_name_says_what_a_name_may_hold(live: Live, tmp_path: Path, args: list[str]) -> None:
    write_spec(tmp_path / "job.yaml", "name: MyJob\ncommand: [x]\n")
    write_spec(tmp_path / "data.yaml", f"name: My-Data\nsource: {tmp_path}\n")
    code, out, err = sluice(*[a.format(dir=tmp_path) for a in args])
    assert code == 2 and out == ""
    assert "is not a valid name: use 1 to 63 lowercase letters, digits, '.', '_' or '-'," in err, err
    assert "pattern" not in err and "[a-z0-9]" not in err


def test_up_refuses_an_unknown_policy_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    code, _, err = sluice("up", "--policy", "nope")
    assert code == 2 and "--policy" in err and "kube" in err
    assert not (tmp_path / "home" / "server.json").exists()


def test_up_and_down_read_server_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SLUICE_HOME", str(home))
    code, out, _ = sluice("down")
    assert code == 0 and "no sluice server is running" in out
    # A server.json naming a live process (this one) means a server is up: `up` does not start another.
    (home / "server.json").write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:1"}))
    code, out, _ = sluice("up", "--detach")
    assert code == 0 and "already running at http://127.0.0.1:1" in out
    # One naming a dead process is stale: `down` has nothing to stop.
    (home / "server.json").write_text(json.dumps({"pid": 2**22 + 12345, "url": "http://127.0.0.1:1"}))
    code, out, _ = sluice("down")
    assert code == 0 and "no sluice server is running" in out


# --------------------------------------------------------------------------- what a new user tripped on


def test_queue_create_states_its_quota_and_names_the_queue_once(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["queue", "create", "research", "--cohort", "lab", "--cores", "8", "--gpus", "4", "--borrow-cores", "4"]
    code, out, err = sluice(*args, "--weight", "2")
    assert code == 0, err
    assert out.strip() == "queue research: cores 0/8 nominal (+4 borrowable); gpus 0/4 nominal; cohort lab, weight 2"
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["admin"])  # an admin lists every queue
    code, out, _ = sluice("queue", "list", "-o", "json")
    summaries = {q["name"]: q["summary"] for q in json.loads(out)}
    assert code == 0 and summaries == {
        "default": "no quota",
        "research": "cores 0/8 nominal (+4 borrowable); gpus 0/4 nominal; cohort lab, weight 2",
    }


def test_queue_problems_name_the_flags_given_not_the_apis_fields(live: Live) -> None:
    """`queue create research --lend-cores 8` was refused naming `lending_limit.cores`, a field
    a CLI user never wrote; checked here or by the server, a problem names the flag."""
    code, _, err = sluice("queue", "create", "research", "--cores", "-2", "--weight", "0")
    assert code == 2 and "--cores: " in err and "--weight: " in err and "nominal.cores" not in err, err
    code, _, err = sluice("queue", "create", "research", "--cohort", "lab", "--cores", "4", "--lend-cores", "8")
    assert code == 2 and "refused by the server" in err, err
    assert "--lend-cores: 8 is more than queue research's nominal cores quota (4)" in err, err
    assert sluice("queue", "create", "research", "--cohort", "lab", "--cores", "4")[0] == 0
    code, _, err = sluice("queue", "set", "research", "--cores", "4", "--borrow-gpus", "2")
    assert code == 2 and "--borrow-gpus: queue research has no nominal gpus quota" in err, err


def test_on_the_planes_machine_queue_reads_and_job_list_tenant_see_what_queue_create_made(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `queue create research` (admin.token) then `queue get research` said "queue 'research'
    # not found", and `queue list` showed `default` alone: they read with the default token.
    assert sluice("queue", "create", "research", "--cores", "2")[0] == 0
    code, out, err = sluice("queue", "get", "research")
    assert code == 0 and "cores 0/2 nominal" in out, err
    code, out, _ = sluice("queue", "list", "-o", "json")
    assert code == 0 and [q["name"] for q in json.loads(out)] == ["default", "research"]
    # `job list --tenant bob` said "no jobs of that tenant" while bob had one.
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    bobs = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))[1].strip()
    code, _, err = sluice("queue", "get", "research")  # a tenant's own token: still only its grants
    assert code == 1 and "queue 'research' not found" in err
    monkeypatch.delenv("SLUICE_TOKEN")
    code, out, err = sluice("job", "list", "--tenant", "bob", "-o", "json")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [bobs], err
    code, out, _ = sluice("job", "list", "-o", "json")  # without --tenant: the default tenant's own
    assert code == 0 and json.loads(out) == []


def test_an_arrays_id_given_as_a_jobs_says_it_is_an_array(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `job submit --array 3` prints the array's id; `job get/why/logs` of it said only "not found".
    array_id = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)), "--array", "3")[1].strip()
    for cmd in ("get", "why", "logs"):
        code, _, err = sluice("job", cmd, array_id)
        assert code == 1 and f"{array_id} is a job array, whose jobs are {array_id}-0 to {array_id}-2" in err, err
        assert f"sluice job list --array {array_id}" in err
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])  # another tenant's array reads as nothing at all
    code, _, err = sluice("job", "get", array_id)
    assert code == 1 and "not found" in err and "array" not in err, err


def test_who_suspended_resumed_or_cancelled_a_job_is_named_as_a_tenant(live: Live, tmp_path: Path) -> None:
    # "suspend: suspended by default" read as if nobody had asked: `default` is a tenant's name.
    job_id = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))[1].strip()
    code, out, err = sluice("job", "suspend", job_id)
    assert code == 0 and "suspended by tenant default" in out, (out, err)
    code, out, err = sluice("job", "resume", job_id)
    assert code == 0 and "resumed by tenant default" in out, (out, err)


def test_queue_set_says_what_a_replaced_quota_or_preemption_setting_dropped(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/queues.md's own example, `queue set research --cores 12` after `--cores 8 --gpus 4`,
    # silently took the queue's GPU quota away.
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["admin"])
    args = ["queue", "create", "research", "--cohort", "lab", "--cores", "8", "--gpus", "4", "--within-queue", "never"]
    assert sluice(*args)[0] == 0
    code, out, err = sluice("queue", "set", "research", "--cores", "12", "-o", "json")
    assert code == 0 and json.loads(out)["nominal"] == {"cores": 12}
    assert "nominal quota of gpus (4) is gone" in err and "add --gpus 4 to keep it" in err, err
    code, _, err = sluice("queue", "set", "research", "--reclaim", "never")
    assert code == 0 and "within_queue went back to lower_priority (was never)" in err, err
    code, _, err = sluice("queue", "set", "research", "--cores", "12", "--weight", "2")
    assert code == 0 and err == "", err  # nothing dropped: nothing said


def test_the_default_queue_cannot_be_deleted_and_says_so(live: Live) -> None:
    import httpx

    code, _, err = sluice("queue", "delete", "default")
    assert code == 1 and "default queue cannot be deleted" in err and "not found" not in err
    r = httpx.delete(f"{live.url}/v1/queues/default", headers={"Authorization": f"Bearer {live.tokens['admin']}"})
    assert r.status_code == 409 and "cannot be deleted" in r.text
    code, out, _ = sluice("queue", "list", "-o", "json")
    assert code == 0 and "default" in [q["name"] for q in json.loads(out)]


def _submitted_and_placed(live: Live, tmp_path: Path, n: int = 1) -> list[str]:
    ids = [sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))[1].strip() for _ in range(n)]
    live.plane.step()
    return ids


def test_job_list_phase_is_case_insensitive_and_an_unknown_one_lists_the_valid_ones(live: Live, tmp_path: Path) -> None:
    [job_id] = _submitted_and_placed(live, tmp_path)
    for spelling in ("starting", "STARTING", "sTaRtInG"):
        code, out, err = sluice("job", "list", "--phase", spelling, "-o", "json")
        assert code == 0, err
        assert [j["id"] for j in json.loads(out)] == [job_id]
    code, out, _ = sluice("job", "list", "-p", "running", "-o", "json")
    assert code == 0 and json.loads(out) == []
    r = runner.invoke(app, ["job", "list", "--phase", "runing"])
    assert r.exit_code == 2 and "--phase" in r.output
    assert all(f"{p.value.lower()!r}" in r.output.lower() for p in Phase)
    assert "Traceback" not in r.output


def test_job_logs_tail_prints_the_last_lines_and_bounds_n(live: Live, tmp_path: Path) -> None:
    [job_id] = _submitted_and_placed(live, tmp_path)
    (tmp_path / f"{job_id}.log").write_text("".join(f"step {i}\n" for i in range(1, 6)))
    code, out, _ = sluice("job", "logs", job_id, "--tail", "2")
    assert code == 0 and out == "step 4\nstep 5\n"
    code, out, _ = sluice("job", "logs", job_id, "-n", "100")
    assert code == 0 and out.count("\n") == 5
    for bad in ("0", "-3", "100001", "many"):
        r = runner.invoke(app, ["job", "logs", job_id, "--tail", bad])
        assert r.exit_code == 2 and "--tail" in r.output, (bad, r.output)
    # the API bounds it too, naming the parameter
    import httpx

    r = httpx.get(f"{live.url}/v1/jobs/{job_id}/logs", params={"tail": 0}, headers=_auth(live))
    assert r.status_code == 422 and "tail" in r.text
    # following starts from the tail, then returns once the job has ended
    attempt = live.plane.controller.book.get(job_id).attempt
    live.engine.pending.append(JobExited(job_id, attempt, live.engine.now, 0))
    live.plane.step()
    code, out, _ = sluice("job", "logs", job_id, "-f", "--tail", "1")
    assert code == 0 and out == "step 5\n"


def test_job_logs_on_a_terminal_show_a_jobs_control_sequences_as_escapes(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's log reached the reader's terminal raw (red-team 5): a job (any tenant's, read
    by the admin) could set the title, plant a hyperlink or write the clipboard (OSC 52).
    Colours and line layout pass; a pipe, or --raw, gets the bytes as they are."""
    import sluice.cli.job as job_cli

    [job_id] = _submitted_and_placed(live, tmp_path)
    log = "\x1b[31mred\x1b[0m\tok\n\x1b]52;c;ZXZpbA==\x07\x1b]0;pwned\x1b\\\x9b2J\n"
    (tmp_path / f"{job_id}.log").write_text(log)
    code, out, _ = sluice("job", "logs", job_id)  # not a terminal: as it is
    assert code == 0 and out == log
    monkeypatch.setattr(job_cli, "_on_terminal", lambda: True)
    code, out, _ = sluice("job", "logs", job_id)
    assert code == 0
    assert out.startswith("\x1b[31mred\x1b[0m\tok\n")  # colours and layout kept
    assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]52;c;ZXZpbA==\\x07" in out  # shown, not run
    code, out, _ = sluice("job", "logs", job_id, "--raw")
    assert code == 0 and out == log


def _auth(live: Live) -> dict[str, str]:
    return {"Authorization": f"Bearer {live.tokens['default']}"}


def test_job_times_read_as_dates_and_ages_while_json_keeps_seconds(live: Live, tmp_path: Path) -> None:
    import re
    import time

    live.engine.now = time.time() - 185  # submitted about three minutes ago
    [job_id] = _submitted_and_placed(live, tmp_path)
    code, out, _ = sluice("job", "get", job_id)
    assert code == 0
    submitted = next(line for line in out.splitlines() if line.strip().startswith("submitted"))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(3m ago\)", submitted), submitted
    code, out, _ = sluice("job", "list")
    assert code == 0 and re.search(rf"{job_id}\s.*\s3m\s", out), out
    _, out, _ = sluice("job", "get", job_id, "-o", "json")
    assert isinstance(json.loads(out)["submitted_at"], float)


def test_a_restart_back_off_reads_in_local_time_while_json_keeps_utc(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re
    import time

    old_tz = os.environ.get("TZ")
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+5:30, so local time is not UTC
    time.tzset()
    try:
        live.engine.now = time.time()
        job_id, attempt = _running(live, tmp_path)
        live.engine.pending.append(JobExited(job_id, attempt, live.engine.now, 3))
        live.plane.step()  # requeued with a back-off
        live.plane.step()  # still backing off: the policy says until when
        until = live.plane.controller.book.get(job_id).not_before
        local = time.strftime("%H:%M:%S", time.localtime(int(until)))
        for args in (("job", "list"), ("job", "why", job_id), ("job", "get", job_id)):
            code, out, _ = sluice(*args)
            assert code == 0 and f"restart back-off until {local}" in out, (args, out)
            assert not re.search(r"t=\d{6,}|\d{4}-\d\d-\d\dT", out), (args, out)
        code, out, _ = sluice("job", "get", job_id, "-o", "json")
        utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))
        assert code == 0 and json.loads(out)["reason"] == f"restart back-off until {utc}"
    finally:
        if old_tz is None:
            monkeypatch.delenv("TZ")
        else:
            monkeypatch.setenv("TZ", old_tz)
        time.tzset()


def test_job_list_keeps_one_line_per_job_at_80_columns(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _submitted_and_placed(live, tmp_path, n=3)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = sluice("job", "list")
    assert code == 0
    lines = [line for line in out.splitlines() if line.strip()]
    assert all(len(line) <= 80 for line in lines), out
    assert len(lines) == 2 + len(ids), out  # header, rule, one line per job
    assert "REASON" in lines[0] and all("kube: fits on" in line and "…" in line for line in lines[2:])
    assert all(any(line.split()[0] == job_id and "mnist" in line for line in lines) for job_id in ids)
    monkeypatch.setenv("COLUMNS", "250")  # wide: every column and the whole reason
    _, out, _ = sluice("job", "list")
    assert "TENANT" in out and "CPU req/lim" in out and "shares only)" in out and "…" not in out


# --------------------------------------------------------------------------- watch, plot, up --home


def _running(live: Live, tmp_path: Path) -> tuple[str, int]:
    [job_id] = _submitted_and_placed(live, tmp_path)
    attempt = live.plane.controller.book.get(job_id).attempt
    live.engine.pending.append(JobStarted(job_id, attempt, "n0", live.engine.now))
    live.plane.step()
    return job_id, attempt


def _report(live: Live, job_id: str, attempt: int, step: int, loss: float, dt: float) -> None:
    t = live.engine.now + dt
    live.engine.pending += [
        JobProgress(job_id, attempt, t, step=step, loss=loss, metrics={"total_steps": 100}),
        JobUsage(job_id, attempt, t, cpu_cores=1.5),
    ]
    live.plane.step()


def test_job_watch_follows_until_the_end_and_exits_by_outcome(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, attempt = _running(live, tmp_path)
    _report(live, job_id, attempt, 10, 2.0, 1)
    ticks: list[float] = []

    def tick(s: float) -> None:  # between two redraws: the job moves on, then ends
        ticks.append(s)
        if len(ticks) == 1:
            _report(live, job_id, attempt, 50, 1.0, 5)
        else:
            live.engine.pending.append(JobExited(job_id, attempt, live.engine.now + 6, 0))
            live.plane.step()

    monkeypatch.setattr("sluice.cli.job.time.sleep", tick)
    code, out, err = sluice("job", "watch", job_id, "--interval", "0.5")
    assert code == 0, err
    assert ticks == [0.5, 0.5] and "step 50/100" in out and f"{job_id}: Succeeded" in out
    cancelled = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))[1].strip()
    sluice("job", "cancel", cancelled)
    code, out, _ = sluice("job", "watch", cancelled)
    assert code == 1 and f"{cancelled}: Cancelled" in out
    assert sluice("job", "watch", "j-nope")[0] == 1


def test_job_get_shows_the_reported_gradient_noise_scale(live: Live, tmp_path: Path) -> None:
    job_id, attempt = _running(live, tmp_path)
    noise = {"total_steps": 100.0, "grad_noise_scale": 420.0, "gns_batch": 64.0}
    for i in range(1, 4):
        t = live.engine.now + 2
        live.engine.pending.append(JobProgress(job_id, attempt, t, step=10 * i, loss=1.0, metrics=noise))
        live.plane.step()
    code, out, err = sluice("job", "get", job_id)
    assert code == 0, err
    assert "gradient noise scale" in out and "420 samples" in out
    code, out, err = sluice("job", "get", job_id, "-o", "json")
    assert code == 0, err


def test_job_plot_writes_an_image_of_loss_throughput_and_cpu(live: Live, tmp_path: Path) -> None:
    job_id, attempt = _running(live, tmp_path)
    for i in range(1, 6):
        _report(live, job_id, attempt, 10 * i, 2.0 / i, 2 * i)
    code, out, err = sluice("job", "plot", job_id, "--out", str(tmp_path / "job.png"))
    assert code == 0, err
    assert (tmp_path / "job.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "wrote" in out
    pending = sluice("job", "submit", str(write_spec(tmp_path / "job.yaml", GOOD_SPEC)))[1].strip()
    code, _, err = sluice("job", "plot", pending, "--out", str(tmp_path / "pending.svg"))  # nothing reported yet
    assert code == 0, err
    assert (tmp_path / "pending.svg").read_text().lstrip().startswith("<?xml")
    code, _, err = sluice("job", "plot", job_id, "--out", str(tmp_path / "no" / "such" / "dir.png"))
    assert code == 2 and "cannot write" in err


def test_plot_series_from_progress_and_events() -> None:
    from sluice.cli.plot import allocation_series, throughput_series
    from sluice.client import EventOut, JobOut

    assert throughput_series([(0.0, 0, 1.0), (2.0, 10, 0.9), (2.0, 10, 0.9), (4.0, 30, None)]) == [
        (2.0, 5.0),
        (4.0, 10.0),
    ]
    one = [{"node": "n0", "cpu_request": 1.0, "cpu_limit": 2.0, "gpus": 0}]
    two = [{"node": "n0", "cpu_request": 2.0, "cpu_limit": None, "gpus": 0}]
    events = [
        EventOut(seq=1, time=10.0, kind="phase", message="-> Pending", data={"to": "Pending"}),
        EventOut(seq=2, time=11.0, kind="place", message="", data={"allocation": one}),
        EventOut(seq=3, time=15.0, kind="resize", message="", data={"allocation": two}),
        EventOut(seq=4, time=20.0, kind="phase", message="", data={"to": "Queued"}),
    ]
    job = JobOut.model_validate(
        {
            **dict.fromkeys(["id", "tenant", "name", "phase", "reason"], "x"),
            **dict.fromkeys(["started_at", "finished_at", "allocation", "exit_code", "checkpoint", "loss"]),
            **dict(submitted_at=10.0, attempt=1, restarts=0, step=0, attained_service=0.0, spec={}),
        }
    )
    assert allocation_series(events, job) == [(11.0, 1.0, 2.0), (15.0, 2.0, None), (20.0, 0.0, 0.0)]


def test_up_takes_a_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "elsewhere"))
    home = tmp_path / "other"
    home.mkdir()
    (home / "server.json").write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:1"}))
    code, out, _ = sluice("up", "--detach", "--home", str(home))
    assert code == 0 and "already running at http://127.0.0.1:1" in out
    assert os.environ["SLUICE_HOME"] == str(tmp_path / "elsewhere")  # the command did not leak its home


# --------------------------------------------------------------------------- other people's strings


HOSTILE = "\x1b]0;pwned\x1b\\\x1b[2J[/] [link=https://evil.example]x[/link]"
"""What a tenant can put in its argv (and so in a launch failure's reason): an OSC title, a
clear-screen, a Rich closing tag with nothing to close, and Rich link markup."""


def test_a_tenants_strings_reach_the_admins_terminal_as_text(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.spec import JobSpec

    bob = live.plane.authenticate(live.tokens["bob"])
    job = live.plane.submit(bob, JobSpec(name="evil", command=["/nonexistent", HOSTILE]))
    live.plane.step()
    record = live.plane.controller.book.get(job.id)
    assert record is not None
    live.engine.pending.append(
        JobExited(
            job.id, record.attempt, live.engine.now, 127, reason=f"launch failed: looked at {HOSTILE}", retryable=False
        )
    )
    live.plane.step()
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["admin"])
    monkeypatch.setenv("COLUMNS", "400")
    for args in (("job", "list"), ("job", "get", job.id), ("job", "why", job.id)):
        code, out, err = sluice(*args)
        assert code == 0, (args, err)  # before: MarkupError: closing tag '[/]' ... has nothing to close
        assert "\x1b" not in out, (args, out)  # before: the ESC sequences reached the terminal
        shown = HOSTILE.replace("\x1b", "\\x1b")  # each ESC written out, the rest as it is
        assert shown in out.replace("\n", ""), (args, out)
    code, out, _ = sluice("job", "get", job.id, "-o", "json")
    assert code == 0 and json.loads(out)["spec"]["command"][1] == HOSTILE  # -o json keeps the data as it is


def test_submit_after_chains_jobs_and_names_a_bad_one(live: Live, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.yaml", GOOD_SPEC)
    first = sluice("job", "submit", str(spec))[1].strip()
    second = sluice("job", "submit", str(spec))[1].strip()
    code, out, err = sluice("job", "submit", str(spec), "--after", first, "--after", second)
    assert code == 0, err
    job = live.plane.store.get_job(out.strip())
    assert job is not None and job.spec.after == [first, second]
    code, out, _ = sluice("job", "get", out.strip())
    assert code == 0 and f"{first}, {second}" in out
    code, _, err = sluice("job", "submit", str(spec), "--after", "j-nope")
    assert code == 2 and "after.0" in err and "you have no job or job array 'j-nope'" in err
    code, _, err = sluice("job", "submit", str(spec), "--after", first, "--after", first)
    assert code == 2 and "more than once" in err
    code, out, err = sluice("job", "submit", str(spec), "--after", first, "--after-any", second)
    assert code == 0, err
    job = live.plane.store.get_job(out.strip())
    assert job is not None and job.spec.after == [first] and job.spec.after_any == [second]
    code, out, _ = sluice("job", "get", out.strip())
    assert code == 0 and "after any" in out and second in out
    code, _, err = sluice("job", "submit", str(spec), "--after", first, "--after-any", first)
    assert code == 2 and "after_any: 'j-" in err and "is also in after" in err


def test_submit_set_and_env_change_the_file_for_one_submit(live: Live, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.yaml", GOOD_SPEC)
    code, out, err = sluice(
        "job", "submit", str(spec), "--set", "resources.cpu.max=4", "--set", "priority=5",
        "--set", "labels.sluice.speedup-group=mnist", "--env", "LR=0.01", "--env", "NOTE=a b; $(rm -rf /)",
    )  # fmt: skip
    assert code == 0, err
    job = live.plane.store.get_job(out.strip())
    assert job is not None and job.spec.resources.cpu.max == 4 and job.spec.priority == 5
    assert job.spec.env == {"LR": "0.01", "NOTE": "a b; $(rm -rf /)"}  # text, never a shell's
    assert job.spec.labels == {"sluice.speedup-group": "mnist"} and job.spec.name == "mnist"
    before = len(live.plane.store.list_jobs())
    code, _, err = sluice("job", "submit", str(spec), "--set", "resources.cpu.max=2000", "--set", "nope=1")
    assert code == 2 and f"invalid job spec {spec}" in err and "resources.cpu" in err and "nope" in err
    code, _, err = sluice("job", "submit", str(spec), "--env", "=1")
    assert code == 2 and "--env: '=1': write NAME=VALUE, e.g. LR=0.01" in err
    assert len(live.plane.store.list_jobs()) == before  # nothing submitted


def test_job_watch_off_a_terminal_writes_a_line_per_phase_and_per_ten_seconds(
    live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped (a CI log), `job watch` showed nothing until the job ended: rich draws no bar
    there. Now a line at each phase change and one every WATCH_LINE_EVERY_S while it moves."""
    job_id, attempt = _running(live, tmp_path)
    _report(live, job_id, attempt, 10, 2.0, 1)
    clock = [100.0]
    moves = [(20, 5.0), (30, 6.0), (40, 1.0)]  # (step, seconds passing): 5 s, then 11 s, then 1 s

    def tick(s: float) -> None:
        if moves:
            step, dt = moves.pop(0)
            clock[0] += dt
            _report(live, job_id, attempt, step, 1.0, dt)
        else:
            live.engine.pending.append(JobExited(job_id, attempt, live.engine.now + 6, 0))
            live.plane.step()

    monkeypatch.setattr("sluice.cli.job.time.sleep", tick)
    monkeypatch.setattr("sluice.cli.job.time.monotonic", lambda: clock[0])
    code, out, err = sluice("job", "watch", job_id)
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split("  loss")[0] for line in lines[:-1]] == [
        "Running   step 10/100",
        "Running   step 30/100",  # not 20 (5 s after the first), nor 40 (1 s after 30)
        "Succeeded step 40/100",  # a phase change is said at once
    ], out
    assert lines[-1].startswith(f"{job_id}: Succeeded")


def test_usage_per_tenant_and_since(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.cli.usage import since_time

    spec = write_spec(tmp_path / "job.yaml", GOOD_SPEC)
    sluice("job", "submit", str(spec))
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["bob"])
    sluice("job", "submit", str(spec))
    code, out, err = sluice("usage", "-o", "json")
    assert code == 0, err
    assert [(u["tenant"], u["phases"]) for u in json.loads(out)] == [("bob", {"Pending": 1})]
    code, _, err = sluice("usage", "--tenant", "default")  # bob's own token: not an admin's
    assert code != 0 and "usage" in err
    code, out, err = sluice("usage", "--all")  # printed bob's own row alone, exit 0, as if every tenant's
    assert code == 1 and out == "" and "every tenant's usage needs an admin token" in err, (out, err)
    monkeypatch.setenv("SLUICE_TOKEN", live.tokens["admin"])
    code, out, _ = sluice("usage", "--all")
    assert code == 0 and "bob" in out and "default" in out and "CORE-HOURS" in out
    code, out, _ = sluice("usage", "--all", "--since", "100000d", "-o", "json")  # the fake clock starts near 0
    assert code == 0 and len(json.loads(out)) == 2
    code, out, _ = sluice("usage", "--all", "--since", "2999-01-01T00:00:00+00:00", "-o", "json")
    assert code == 0 and json.loads(out) == []
    for bad in ("yesterday", "2026-11-01", "-1h"):
        code, _, err = sluice("usage", "--since", bad)
        assert code == 2 and "--since" in err
    assert since_time("2d", now=1_000_000.0) == 1_000_000.0 - 2 * 86400


def test_on_the_planes_machine_dataset_publish_and_tenant_reads_use_the_admin_token(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `sluice dataset publish imgs --tenant bob`, as docs/data.md shows it, said "not allowed:
    # publishing a dataset to every tenant needs an admin token" on the plane's own machine: it
    # sent the default tenant's token, where `queue create` and `job list --tenant` send admin.token.
    from sluice.spec import DatasetSpec

    bob = live.plane.authenticate(live.tokens["bob"])
    live.plane.datasets.create(bob, DatasetSpec(name="imgs", source="http://93.184.216.34/imgs/"), probe=False)
    code, out, err = sluice("dataset", "publish", "imgs", "--tenant", "bob")
    assert code == 0 and "published dataset imgs of tenant bob" in out, err
    code, out, err = sluice("dataset", "get", "imgs", "--tenant", "bob", "-o", "json")
    assert code == 0 and json.loads(out)["published"] is True, err
    code, out, err = sluice("dataset", "unpublish", "imgs", "--tenant", "bob")
    assert code == 0 and "withdrew dataset imgs of tenant bob" in out, err
    code, _, err = sluice("dataset", "get", "imgs", "--tenant", "bob")
    assert code == 0, err
    code, out, err = sluice("dataset", "rm", "imgs", "--tenant", "bob")
    assert code == 0 and "deleted dataset imgs" in out, err
