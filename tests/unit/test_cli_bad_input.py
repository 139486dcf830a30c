"""Every `sluice` command, found by walking the typer app (a new command is covered without
touching this file), run with input a user can type wrongly: missing arguments, unknown
options, files that are not spec files (/dev/zero, a FIFO, a directory, a missing path,
garbage YAML), numbers that are not numbers or are absurd, and a server that is down.

What must hold for each: a non-zero exit and no Python traceback — the user gets a message.

Commands that talk to the API (job, node, tenant, dataset, down) get every bad value in every
parameter. Commands that do long local work (demo, up, bench, sim run, health eval) would
start that work if handed a value their type accepts, so they get only what must fail before
any work starts: a missing required argument, an unknown option, an unusable file argument.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from sluice.cli.main import app

from ..live_api import free_port

API_GROUPS = {"job", "node", "tenant", "dataset", "down"}
"""Commands that only talk to the server: safe to hand any value while it is down."""

NUMBERS = ["1e400", "nan", "-1", "99999999999999999999999", "x"]


def commands() -> list[tuple[list[str], Any]]:
    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    return list(walk(typer.main.get_command(app), []))


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, str]:
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("command: [python\n  - : :\n\t]]]")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {
        "/dev/zero": "/dev/zero",
        "fifo": str(fifo),
        "directory": str(tmp_path),
        "missing": str(tmp_path / "nope.yaml"),
        "garbage": str(garbage),
    }


@pytest.fixture(autouse=True)
def server_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("SLUICE_TOKEN", "not-a-token")


def run(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    text = (result.stdout or "") + (result.stderr or "")
    where = f"sluice {' '.join(args)} -> exit {result.exit_code}\n{text[-2000:]}"
    assert result.exit_code != 0, where
    assert "Traceback" not in text, where
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{where}\nraised {result.exception!r}")


def invocations(path: list[str], cmd: Any, files: dict[str, str]) -> Iterator[list[str]]:
    params = [p for p in cmd.params if p.name != "help"]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option" and not p.is_flag]
    if any(p.required for p in params):
        yield path  # required arguments missing
    yield [*path, "--no-such-option"]
    # every argument gets each unusable file; a non-file argument just gets a strange name
    for value in files.values():
        if arguments:
            yield [*path, *([value] * len(arguments)), *_required_options(options)]
    if path[0] not in API_GROUPS:
        return
    fill = ["x"] * len(arguments)
    for opt in options:
        for value in [*NUMBERS, *files.values()]:
            yield [*path, *fill, *_required_options([o for o in options if o is not opt]), opt.opts[0], value]


def _required_options(options: list[Any]) -> list[str]:
    out: list[str] = []
    for o in options:
        if o.required:
            out += [o.opts[0], "x"]
    return out


def test_the_walk_finds_every_noun() -> None:
    found = {p[0] for p, _ in commands()}
    assert {"job", "node", "tenant", "dataset", "sim", "bench", "health", "up", "down", "demo"} <= found


@pytest.mark.parametrize(("path", "cmd"), commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_no_command_prints_a_traceback_for_bad_input(path: list[str], cmd: Any, bad_files: dict[str, str]) -> None:
    for args in invocations(path, cmd, bad_files):
        run(args)


@pytest.mark.parametrize(
    "args", [["--batch", "2"], ["--batch", "100000"], ["--width", "0"], ["--contenders", "fixed 3"]]
)
def test_bench_elastic_refuses_sizes_out_of_bounds_before_any_work(args: list[str]) -> None:
    res = CliRunner().invoke(app, ["bench", "elastic", *args])
    assert res.exit_code == 2, res.output
    assert args[0] in res.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["node", "fault", "node-0", "cpu", "-s", "nan"], "--seconds"),
        (["node", "fault", "node-0", "cpu", "--seconds", "inf"], "--seconds"),
        (["job", "watch", "j-1", "--interval", "nan"], "--interval"),
        (["job", "watch", "j-1", "--interval", "-inf"], "--interval"),
        (["demo", "--stagger", "nan"], "--stagger"),
        (["demo", "--scale", "inf"], "--scale"),
    ],
)
def test_a_non_finite_float_option_is_named_as_such(args: list[str], flag: str) -> None:
    """NaN compares false with every bound: it must not read as 'should be at most 3600'."""
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert f"{flag}: must be a finite number" in res.output, res.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--policy", "bogus"], "--policy: unknown policy 'bogus'"),
        (["--policy", "kube,fifo"], "--policy: the demo runs one policy"),
        (["--interval", "0"], "--interval: must be a number at least 0.5"),
        (["--scale", "0"], "--scale: must be a number at least 0.01"),
    ],
)
def test_the_demo_judges_its_flags_before_it_starts_a_plane(args: list[str], says: str, tmp_path: Path) -> None:
    """`demo --stagger nan` ran a plane that never submitted; a bad policy name came back
    as a ValueError after the plane's folder was made."""
    home = tmp_path / "demo"
    res = CliRunner().invoke(app, ["demo", "--home", str(home), *args])
    assert res.exit_code == 2, res.output
    assert says in res.output, res.output
    assert not home.exists()


def test_bench_data_refuses_datasets_larger_than_the_space_it_writes_them_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """64 large files of 1 GiB were accepted and written to /dev/shm: the machine's memory."""
    import shutil
    from collections import namedtuple

    import sluice.bench.data as bench_data

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(bench_data, "work_base", lambda: tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(2 * 2**30, 0, 2**30))
    res = CliRunner().invoke(app, ["bench", "data", "--large-files", "64", "--large-mb", "1024"])
    assert res.exit_code == 2, res.output
    assert "--large-mb" in res.output and "1.0 GiB free" in res.output
    assert not list(tmp_path.iterdir())  # nothing made


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["cpu", "--stop"], "not both"),
        ([], "give a fault KIND"),
        (["--stop", "--memory-mb", "7"], "--stop: stops every fault on the node; it takes no"),
        # the API takes 1..1048576 MiB; the help said only x>=1 and a larger one made the round trip
        (["memory", "--memory-mb", "1048577"], "--memory-mb': Input should be less than or equal to 1048576"),
    ],
)
def test_node_fault_refuses_flags_it_would_ignore(args: list[str], says: str) -> None:
    res = CliRunner().invoke(app, ["node", "fault", "node-0", *args])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.replace("│", " ").split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["job", "list", "--phase", "runing"], "'runing' is not one of 'pending'"),
        (["up", "--engine", "k8s"], "'k8s' is not one of 'local', 'ray'"),
    ],
)
def test_a_bad_choice_is_said_without_pydantics_prefix(args: list[str], says: str) -> None:
    # It read "Invalid value for '--phase' / '-p': Value error, 'runing' is not one of ...".
    result = CliRunner().invoke(app, args)
    text = " ".join(((result.stdout or "") + (result.stderr or "")).split())
    assert result.exit_code == 2 and says in text and "Value error" not in text, text


def test_up_names_an_unknown_policy_where_it_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`policy: nope` in settings.yaml (or SLUICE_POLICY=nope) was reported as `--policy`, a
    flag the user never gave."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.delenv("SLUICE_POLICY", raising=False)
    (home / "settings.yaml").write_text("policy: nope\n")
    res = CliRunner().invoke(app, ["up", "--detach"])
    assert res.exit_code == 2, res.output
    assert "error: policy (SLUICE_POLICY or settings.yaml): unknown policy 'nope'" in res.output, res.output
    res = CliRunner().invoke(app, ["up", "--detach", "--policy", "bogus"])  # the flag wins, and is named
    assert res.exit_code == 2 and "error: --policy: unknown policy 'bogus'" in res.output, res.output
    assert not (home / "server.json").exists()
