"""`sluice bench local | simreal | threads | data | ray | agent | health | fairness` on bad input:
every numeric flag is finite and within the bound its --help states, and names, paths and
policies are checked before anything runs (`bench sim`'s checks: test_sim_cli_bad_input.py).

What must hold for each: exit 2, one line `error: <flag>: <problem>` on stderr, no traceback,
and no benchmark started (the runners are replaced by ones that fail the test). Each case
was accepted before these checks: it ran (for ever, with inf), crashed after minutes of
profiling or runs, or ended in a traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app

pytestmark = pytest.mark.timeout(60)  # a hang these guard against must fail, not stall the suite

HUGE = "1" + "0" * 400  # an int past float's range: it was an OverflowError traceback in the range check

RUNNERS = {
    "local": ("sluice.bench.local", "run"),
    "simreal": ("sluice.bench.simreal", "compare"),
    "threads": ("sluice.bench.threads", "run"),
    "data": ("sluice.bench.data", "run"),
    "ray": ("sluice.bench.ray", "run"),
    "agent": ("sluice.bench.agent", "run"),
    "health": ("sluice.bench.health", "run"),
    "health-free": ("sluice.bench.health", "false_alarms"),
    "campaign": ("sluice.bench.health_campaign", "campaign"),
    "fairness": ("sluice.bench.fairness", "run"),
}


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any benchmark started is a failure: bad input stops before them."""
    import importlib

    def started(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("work started despite bad input")

    for module, name in RUNNERS.values():
        monkeypatch.setattr(importlib.import_module(module), name, started)


def refused(args: list[str], where: str) -> str:
    """Run the CLI; check exit 2 and a single `error: WHERE...` line with no traceback. The error line."""
    r = CliRunner().invoke(app, args)
    said = f"sluice {' '.join(args)} -> exit {r.exit_code}\n{r.output[-2000:]}"
    assert r.exit_code == 2, said
    assert r.exception is None or isinstance(r.exception, SystemExit), said
    assert "Traceback" not in r.output, said
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, said
    assert lines[0].startswith(f"error: {where}"), said
    return lines[0]


BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "1e300")

FLOAT_FLAGS = [
    ("local", "--stagger"),
    ("local", "--scale"),
    ("local", "--interval"),
    ("simreal", "--stagger"),
    ("simreal", "--scale"),
    ("simreal", "--interval"),
    ("simreal", "--profile-seconds"),
    ("threads", "--before-s"),
    ("threads", "--after-s"),
    ("threads", "--from-cores"),
    ("threads", "--to-cores"),
    ("data", "--latency-ms"),
    ("ray", "--stagger"),
    ("ray", "--scale"),
    ("ray", "--move-scale"),
    ("ray", "--interval"),
    ("agent", "--seconds"),
    ("agent", "--interval"),
    ("health", "--fault-free-minutes"),
    ("health", "--minutes"),
    ("health", "--fault-seconds"),
    ("fairness", "--start-day"),
    ("fairness", "--hours"),
    ("fairness", "--interval"),
    ("fairness", "--grace"),
    ("fairness", "--preempt-min-runtime"),
]

INT_FLAGS = [
    ("data", "--files"),
    ("data", "--remote-files"),
    ("data", "--large-files"),
    ("data", "--large-mb"),
    ("data", "--two-jobs-epochs"),
    ("agent", "--jobs"),
    ("health", "--seed"),
    ("fairness", "--nodes"),
    ("fairness", "--max-jobs"),
    ("fairness", "--workers"),
]


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(("command", "flag"), FLOAT_FLAGS)
@pytest.mark.parametrize("value", BAD_NUMBERS)
def test_every_float_flag_is_finite_and_bounded(command: str, flag: str, value: str) -> None:
    line = refused(["bench", command, f"{flag}={value}"], flag)
    assert ("must be a finite number" if value in ("nan", "inf", "-inf") else "must be a number") in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(("command", "flag"), INT_FLAGS)
@pytest.mark.parametrize("value", ["-1", HUGE])
def test_every_int_flag_is_bounded(command: str, flag: str, value: str) -> None:
    line = refused(["bench", command, f"{flag}={value}"], flag)
    assert "must be a number" in line
    if value == HUGE:
        assert "(401 digits)" in line  # named short, not printed in full


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["local", "--scale", "0"], "--scale"),  # was: a plane with jobs of one step each
        (["local", "--interval", "0"], "--interval"),  # was: a pydantic traceback from the plane's settings
        (["threads", "--from-cores", "0"], "--from-cores"),  # below the smallest quota a cgroup takes
        (["threads", "--before-s", "0"], "--before-s"),  # nothing to measure
        (["agent", "--interval", "0.01"], "--interval"),
        (["health", "--fault-seconds", "4"], "--fault-seconds"),
        (["data", "--files", "0"], "--files"),
        (["data", "--files", "10", "--remote-files", "11"], "--remote-files"),
        (["fairness", "--workers", "0"], "--workers"),
    ],
)
def test_edges_of_the_bounds_are_refused(args: list[str], flag: str) -> None:
    refused(["bench", *args], flag)


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["local", "--policies", "kube,nope"], "--policies"),  # was: kube ran for minutes, then a traceback
        (["local", "--policies", ""], "--policies"),
        (["local", "--policies", ","], "--policies"),
        (["simreal", "--policies", "nope"], "--policies"),  # was: found after every profile was measured
        (["ray", "--policy", "nope"], "--policy"),
        (["ray", "--policy", ""], "--policy"),
        (["ray", "--policy", "kube,flowcon"], "--policy"),
        (["ray", "--parts", ""], "--parts"),
        (["data", "--scenarios", "7"], "--scenarios"),  # was: silently ran nothing
        (["data", "--scenarios", ""], "--scenarios"),
        (["data", "--remote", ""], "--remote"),
        (["health", "--inject-io-at-minute", "1"], "--inject-io-at-minute"),  # was: ignored
        (["health", "--fault-free-minutes", "5", "--inject-io-at-minute", "6"], "--inject-io-at-minute"),
    ],
)
def test_names_are_checked_before_any_run(args: list[str], flag: str) -> None:
    refused(["bench", *args], flag)


@pytest.mark.usefixtures("nothing_runs")
def test_policy_lists_name_every_policy_variants_included() -> None:
    from sluice.control.simulate import policy_names

    line = refused(["bench", "local", "--policies", "nope"], "--policies")
    for name in policy_names():
        assert name in line
    assert "sluice-gns" in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("command", ["local", "simreal", "threads", "data", "ray", "health", "fairness"])
def test_out_is_checked_before_the_run(command: str, tmp_path: Path) -> None:
    """--out is written when the bench ends: a folder that is not there was a traceback after the run."""
    refused(["bench", command, "--out", str(tmp_path / "no" / "such" / "x.json")], "--out")
    refused(["bench", command, "--out", str(tmp_path)], "--out")


@pytest.mark.usefixtures("nothing_runs")
def test_simreal_paths_are_checked_before_profiling(tmp_path: Path) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    refused(["bench", "simreal", "--profiles", str(afile)], "--profiles")
    refused(["bench", "simreal", "--real-from", str(tmp_path / "nope.json")], "--real-from")
    for bad in ("not json", "{}", "[]", '[{"policy": "kube"}]', '[{"policy": "kube", "real": {"jobs": []}}]'):
        afile.write_text(bad)
        refused(["bench", "simreal", "--real-from", str(afile)], "--real-from")
    run = {"policy": "kube", "real": {"jobs": []}, "node_cpus": float("nan"), "background_cores": 0.1}
    afile.write_text(json.dumps([run]))
    assert "node_cpus" in refused(["bench", "simreal", "--real-from", str(afile)], "--real-from")


def test_valid_flags_reach_the_runners(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The bounds' ends are accepted and passed through as given."""
    import sluice.bench.local as bench_local
    import sluice.bench.simreal as bench_simreal
    import sluice.bench.threads as bench_threads

    seen: dict[str, Any] = {}
    monkeypatch.setattr(bench_local, "run", lambda names, **kw: seen.update(local=(names, kw)))
    monkeypatch.setattr(bench_simreal, "compare", lambda names, **kw: seen.update(simreal=(names, kw)))
    monkeypatch.setattr(bench_threads, "run", lambda **kw: seen.update(threads=kw))
    runner = CliRunner()
    args = ["--stagger", "0", "--scale", "10", "--interval", "0.5", "--out", str(tmp_path / "o.json")]
    r = runner.invoke(app, ["bench", "local", "--policies", "kube, sluice-gns", *args])
    assert r.exit_code == 0, r.output
    assert seen["local"][0] == ["kube", "sluice-gns"] and seen["local"][1]["scale"] == 10
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps([{"policy": "kube", "real": {"jobs": []}, "node_cpus": 2, "background_cores": 0}]))
    r = runner.invoke(
        app,
        ["bench", "simreal", "--policies", "kube", "--profile-seconds", "3600", "--real-from", str(earlier), *args],
    )
    assert r.exit_code == 0, r.output
    assert seen["simreal"][1]["profile_seconds"] == 3600 and seen["simreal"][1]["real_from"] == earlier
    r = runner.invoke(app, ["bench", "threads", "--before-s", "1", "--to-cores", "0.01", "--from-cores", "1024"])
    assert r.exit_code == 0, r.output
    assert seen["threads"]["to_cores"] == 0.01 and seen["threads"]["from_cores"] == 1024


def test_every_bounded_flag_states_its_bound_in_help() -> None:
    """What the checks refuse is what --help says: each flag tested above names a range."""
    import typer

    from sluice.cli.bench import app as bench_app

    commands = {c.name: c for c in typer.main.get_command(bench_app).commands.values()}  # type: ignore[attr-defined]
    for command, flag in {*FLOAT_FLAGS, *INT_FLAGS}:
        param = next(p for p in commands[command].params if f"--{p.name.replace('_', '-')}" == flag)
        assert re.search(r"\d+(\.\d+)? to [\d,.]+|1 to --files|to --fault-free-minutes", param.help or ""), (
            command,
            flag,
            param.help,
        )
