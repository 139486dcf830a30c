"""`sluice sim run`, `sluice sim profile` and `sluice bench sim` on bad input: every numeric flag
has a finite range, every name (policy, node, application) and every workload row is checked
before anything runs, and a job the cluster could never hold is refused up front.

What must hold for each: exit 2, one line `error: <flag or row>: <problem>` on stderr, no
traceback, and no simulation started (the runners are replaced by ones that fail the test).
Each case hung, crashed with a traceback or was silently accepted before these checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.cli.sim import SIMREAL_EXAMPLES, _profile_use

pytestmark = pytest.mark.timeout(30)  # the hangs these guard against must fail, not stall the suite

TRACE = "job_id,submit_time,duration,gpu_num,user\n"
POLLUX = "name,time,application,num_replicas,batch_size\n"


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any simulation, profile or benchmark started is a failure: bad input stops before them."""

    def started(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("work started despite bad input")

    import sluice.bench.sim as bench_sim
    import sluice.control.profile as profile
    import sluice.control.simulate as simulate

    monkeypatch.setattr(simulate, "run_simulation", started)
    monkeypatch.setattr(bench_sim, "run", started)
    monkeypatch.setattr(profile, "profile_example", started)


@pytest.fixture
def one_job(tmp_path: Path) -> Path:
    wl = tmp_path / "one.csv"
    wl.write_text(TRACE + "a,0,600,1,u\n")
    return wl


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


# -- sim run: flags ---------------------------------------------------------------------------


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--interval", "nan"),  # was: ValueError cannot convert float NaN to integer
        ("--interval", "inf"),
        ("--interval", "1e-9"),  # was: hung
        ("--cpus-per-node", "nan"),  # was: hung
        ("--cpus-per-node", "inf"),
        ("--cpus-per-node", "0.1"),
        ("--fail-rate", "1e9"),  # was: hung
        ("--nodes", "100000000"),  # was: hung
        ("--load-factor", "nan"),  # was: accepted
        ("--load-factor", "inf"),
        ("--window-hours", "-1"),  # was: accepted
        ("--window-hours", "0"),
    ],
)
def test_sim_run_refuses_flag_values_out_of_range(one_job: Path, flag: str, value: str) -> None:
    line = refused(["sim", "run", "--workload", str(one_job), flag, value], flag)
    assert "at most" in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("10:n99", "no node 'n99'; the nodes are n00 to n15"),  # was: KeyError 'n99'
        ("-10:n03", "SECONDS must be from 0"),  # was: accepted
        ("nan:n03", "SECONDS must be from 0"),
        ("10:3", "no node '3'"),
        ("n03", "expected SECONDS:NODE"),
    ],
)
def test_sim_run_checks_fail_at_times_and_node_names(one_job: Path, item: str, problem: str) -> None:
    line = refused(["sim", "run", "--workload", str(one_job), "--fail-at", item], f"--fail-at {item}")
    assert problem in line


@pytest.mark.usefixtures("nothing_runs")
def test_sim_run_checks_the_policy_before_reading_the_workload(tmp_path: Path) -> None:
    line = refused(["sim", "run", "--workload", str(tmp_path / "missing.csv"), "--policy", "nope"], "--policy")
    assert "unknown policy 'nope'" in line and "sluice" in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("cpu:100000000", "N must be from 1 to 100000"),  # was: hung generating the jobs
        ("cpu:0", "N must be from 1"),
        ("cpu:3:nan", "STAGGER_S must be from 0"),
        ("cpu:3:-1", "STAGGER_S must be from 0"),
        ("cpu:x", "expected cpu:N[:STAGGER_S]"),
    ],
)
def test_sim_run_bounds_the_synthetic_cpu_workload(spec: str, problem: str) -> None:
    line = refused(["sim", "run", "--workload", spec], f"--workload {spec}")
    assert problem in line


@pytest.mark.usefixtures("nothing_runs")
def test_every_numeric_flag_is_bounded_and_its_help_says_how(one_job: Path, tmp_path: Path) -> None:
    """A new numeric option of these commands must come with its range (and this test finds it)."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ncommand: [python, x.py]\n")
    commands = {
        ("sim", "run"): ["--workload", str(one_job)],
        ("sim", "profile"): [str(spec)],
        ("bench", "sim"): [],
    }
    for path, base in commands.items():
        numeric = [
            p for p in _command(*path).params if _annotation(p) in (int, float) and p.param_type_name == "option"
        ]
        assert numeric, path
        for opt in numeric:
            flag = opt.opts[0]
            assert " to " in (opt.help or "") or "at most" in (opt.help or ""), f"{flag} help gives no range"
            floats = ["nan", "inf", "1e400"] if _annotation(opt) is float else []
            for value in ["-1", "99999999999999999999", *floats]:
                refused([*path, *base, flag, value], flag)


def _command(*path: str) -> Any:
    cmd: Any = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _annotation(param: Any) -> Any:
    descriptor = getattr(param, "type_descriptor", None)
    return getattr(descriptor, "annotation", None)


# -- sim run: workload files and rows ---------------------------------------------------------


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("rows", "problem"),
    [
        (TRACE + "a,0,-5,1,u\n", ":2: column 'duration' must be from 0"),  # was: dropped silently
        (TRACE + "a,0,600,1,u\nb,0,600,-2,u\n", ":3: column 'gpu_num' must be from 0"),  # was: dropped silently
        (TRACE + "a,0,1e300,1,u\n", ":2: column 'duration' must be from 0 to 100000000"),  # was: OverflowError flood
        (TRACE + "a,0,nan,1,u\n", ":2: column 'duration' must be a finite number"),
        (TRACE + "a,0,600,inf,u\n", ":2: column 'gpu_num' must be a finite number"),  # was: OverflowError
        (TRACE + "a,0,600,1.5,u\n", ":2: column 'gpu_num' must be a whole number"),
        (TRACE + "a,nan,600,1,u\n", ":2: column 'submit_time' must be a finite time"),
        (TRACE + "a,0,600,1,u\nb,1e300,600,1,u\n", ":3: column 'submit_time': arrives"),  # was: endless rounds
        (POLLUX + "a,-1,ncf,1,256\n", ":2: column 'time' must be from 0"),
        (POLLUX + "a,0,ncf,0,256\n", ":2: column 'num_replicas' must be from 1"),
        (POLLUX + "a,0,ncf,1,-256\n", ":2: column 'batch_size' must be from 1"),
    ],
)
def test_sim_run_refuses_invalid_rows_with_their_row_number(tmp_path: Path, rows: str, problem: str) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(rows)
    line = refused(["sim", "run", "--workload", str(wl)], "--workload")
    assert f"{wl}{problem}" in line


def test_sim_run_skips_rows_without_gpu_work_with_a_note(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(TRACE + "cpu-only,0,600,0,u\nempty,0,0,2,u\nreal,0,60,1,u\n")
    r = CliRunner().invoke(app, ["sim", "run", "--workload", str(wl), "--nodes", "1", "--policy", "fifo"])
    assert r.exit_code == 0, r.output
    assert "note: --workload: skipped 2 row(s) with 0 GPUs or 0 duration" in r.stderr


@pytest.mark.usefixtures("nothing_runs")
def test_sim_run_names_what_is_wrong_with_a_file_that_is_no_workload(tmp_path: Path) -> None:
    binary = tmp_path / "w.csv"
    binary.write_bytes(bytes(range(256)) * 8)
    assert "is not a text CSV file" in refused(["sim", "run", "--workload", str(binary)], "--workload")
    assert "is a directory" in refused(["sim", "run", "--workload", str(tmp_path)], "--workload")
    assert "is not a regular file" in refused(["sim", "run", "--workload", "/dev/null"], "--workload")
    assert "does not exist" in refused(["sim", "run", "--workload", str(tmp_path / "nope.csv")], "--workload")


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("gpus", [9, 1_000_000])
def test_sim_run_refuses_a_job_the_cluster_could_never_hold(tmp_path: Path, gpus: int) -> None:
    """Was: the simulator waited for ever for room that never came, printing nothing."""
    wl = tmp_path / "w.csv"
    wl.write_text(TRACE + f"small,0,60,1,u\nhuge,10,600,{gpus},u\n")
    line = refused(["sim", "run", "--workload", str(wl), "--nodes", "2", "--gpus-per-node", "4"], "--workload")
    assert f"job 'huge' needs {gpus} GPUs but the cluster has 8" in line and "never be placed" in line


@pytest.mark.usefixtures("nothing_runs")
def test_sim_run_checks_applications_before_the_job_arrives(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(POLLUX + "a,0,ncf,1,256\nb,36000,no-such-app,1,256\n")
    line = refused(["sim", "run", "--workload", str(wl)], "--workload")
    assert "job 'b': unknown application 'no-such-app'" in line


def test_a_job_that_fits_exactly_still_runs(tmp_path: Path) -> None:
    wl = tmp_path / "w.csv"
    wl.write_text(TRACE + "a,0,60,8,u\n")
    r = CliRunner().invoke(app, ["sim", "run", "--workload", str(wl), "--nodes", "2", "--fail-at", "30:n1"])
    assert r.exit_code == 0, r.output


# -- sim profile -------------------------------------------------------------------------------


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--cores", "nan"], "--cores nan"),
        (["--cores", "0.5,-1"], "--cores 0.5,-1"),
        (["--seconds", "nan"], "--seconds"),
        (["--seconds", "1"], "--seconds"),
    ],
)
def test_sim_profile_bounds_its_flags(tmp_path: Path, args: list[str], flag: str) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ncommand: [python, x.py]\n")
    refused(["sim", "profile", str(spec), *args], flag)


def test_sim_profile_says_how_a_profile_is_really_used() -> None:
    """Was: 'use it in a workload as cpu_profile=...', which no workload format or cpu:N takes."""
    hint = _profile_use(Path("examples/mlp.profile.json"), Path("examples/mlp.yaml"))
    assert "cpu_profile=" not in hint
    assert "sluice bench simreal --profiles examples" in hint and "reads mlp.profile.json" in hint
    other = _profile_use(Path("/tmp/p.json"), Path("examples/mlp.yaml"))
    assert "--profiles DIR" in other and "mlp.profile.json" in other
    ddp = _profile_use(Path("examples/ddp.profile.json"), Path("examples/ddp.yaml"))
    assert "cpu_profile='examples/ddp.profile.json'" in ddp and "docs/simulator.md" in ddp
    from sluice.bench.scenario import mixed_workload
    from sluice.bench.simreal import example_of

    assert set(SIMREAL_EXAMPLES) == {example_of(a) for a in mixed_workload()}


def test_the_simulator_docs_say_how_a_profile_is_used() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    assert "--profiles" in docs and "cpu_profile" in docs


# -- bench sim ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--cpu-policies", "nope"], "--cpu-policies"),  # was: a bare ValueError, exit 1
        (["--policies", "sluice,nope"], "--policies"),  # was: found after `sluice` had run for minutes
        (["--policies", ","], "--policies"),
        (["--scale-policy", "nope"], "--scale-policy"),
        (["--cpu-policies", "sluice-gns"], "--cpu-policies"),  # variants exist for the pollux part only
        (["--parts", "nope"], "--parts"),
        (["--loads", "3.0"], "--loads"),
        (["--workloads", "9"], "--workloads"),
    ],
)
def test_bench_sim_checks_every_name_before_any_run(args: list[str], flag: str) -> None:
    refused(["bench", "sim", *args], flag)


@pytest.mark.usefixtures("nothing_runs")
def test_bench_sim_lists_every_name_it_takes_variants_included() -> None:
    from sluice.bench.sim import GPU_POLICIES, VARIANTS

    line = refused(["bench", "sim", "--policies", "nope"], "--policies")
    for name in {*GPU_POLICIES, *VARIANTS}:
        assert name in line


def test_bench_sim_passes_valid_names_through(monkeypatch: pytest.MonkeyPatch) -> None:
    import sluice.bench.sim as bench_sim

    seen: dict[str, Any] = {}
    monkeypatch.setattr(bench_sim, "run", lambda **kw: seen.update(kw))
    args = ["bench", "sim", "--parts", "pollux,cpu", "--policies", "sluice,sluice-gns,pollux,pollux-prior"]
    r = CliRunner().invoke(app, [*args, "--cpu-policies", "kube,flowcon", "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert seen["policies"] == ["sluice", "sluice-gns", "pollux", "pollux-prior"]
    assert seen["cpu_policies"] == ["kube", "flowcon"] and seen["workers"] == 2


def test_bench_sim_help_names_the_default_policies() -> None:
    from sluice.bench.sim import CPU_POLICIES, GPU_POLICIES

    helps = {p.name: p.help or "" for p in _command("bench", "sim").params}
    assert f"(default: {', '.join(GPU_POLICIES)})" in helps["policies"]
    assert f"(default: {', '.join(CPU_POLICIES)})" in helps["cpu_policies"]


# -- one list of policy names: the registry's, variants included -------------------------------


@pytest.mark.parametrize("variant", ["pollux-prior", "sluice-prior", "sluice-gns"])
def test_sim_run_takes_the_variants_bench_sim_takes(variant: str, one_job: Path) -> None:
    """`bench sim --policies` ran these; `sim run --policy` refused them (its list lacked them)."""
    r = CliRunner().invoke(app, ["sim", "run", "--workload", str(one_job), "--policy", variant, "-o", "json"])
    assert r.exit_code == 0, r.output
    assert '"policy": "' + variant + '"' in r.output  # labelled by the name given, not its base policy


def test_every_policy_list_is_the_registry_one() -> None:
    from sluice.bench.sim import GPU_POLICIES
    from sluice.control.simulate import policy_names
    from sluice.policy.registry import POLICIES, VARIANTS, make_policy
    from sluice.server import policy_names as server_names

    assert policy_names() == server_names() == sorted({*POLICIES, *VARIANTS})
    assert policy_names(variants=False) == sorted(POLICIES)
    assert set(GPU_POLICIES) <= set(policy_names())
    r = CliRunner().invoke(app, ["sim", "policies"])
    assert r.output.split() == policy_names()
    gns = make_policy("sluice-gns")
    assert gns.carry_noise and gns.learn_speedup  # type: ignore[attr-defined]
    assert not make_policy("sluice-gns", carry_noise=False).carry_noise  # type: ignore[attr-defined]


@pytest.mark.usefixtures("nothing_runs")
def test_sim_run_names_every_policy_it_takes() -> None:
    from sluice.control.simulate import policy_names

    line = refused(["sim", "run", "--workload", "cpu:2", "--policy", "nope"], "--policy")
    for name in policy_names():
        assert name in line
    assert "sluice-gns" in line and "pollux-prior" in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize("flag", ["--nodes", "--max-jobs", "--seed"])
def test_sim_run_ints_past_float_range_are_refused(flag: str) -> None:
    """An int too large for a float was `error: OverflowError` from the range check."""
    line = refused(["sim", "run", "--workload", "cpu:2", flag, "1" + "0" * 400], flag)
    assert "(401 digits)" in line


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--parts", "cpu", "--policies", "sluice"], "--policies"),  # was: run without the pollux part, ignored
        (["--parts", "cpu", "--loads", "0.5"], "--loads"),
        (["--parts", "scale", "--workloads", "3"], "--workloads"),
        (["--parts", "pollux", "--cpu-policies", "kube"], "--cpu-policies"),
        (["--parts", "pollux", "--scale-policy", "pollux"], "--scale-policy"),
        (["--parts", "cpu", "--scale-jobs", "100"], "--scale-jobs"),
        (["--parts", "cpu", "--scale-nodes", "10"], "--scale-nodes"),
        (["--parts", "cpu", "--scale-load-factor", "2"], "--scale-load-factor"),
        (["--parts", "pollux,cpu", "--scale-hours", "6"], "--scale-hours"),
    ],
)
def test_bench_sim_refuses_a_flag_of_a_part_it_does_not_run(args: list[str], flag: str) -> None:
    line = refused(["bench", "sim", *args], flag)
    assert "not run" in line and "--parts" in line


def test_bench_sim_takes_each_part_flag_with_its_part(monkeypatch: pytest.MonkeyPatch) -> None:
    import sluice.bench.sim as bench_sim

    seen: dict[str, Any] = {}
    monkeypatch.setattr(bench_sim, "run", lambda **kw: seen.update(kw))
    args = ["bench", "sim", "--parts", "pollux,cpu,scale", "--loads", "0.5", "--workloads", "3", "--policies", "sluice"]
    args += ["--cpu-policies", "kube", "--scale-policy", "pollux", "--scale-jobs", "100", "--scale-hours", "6"]
    r = CliRunner().invoke(app, [*args, "--scale-nodes", "10", "--scale-load-factor", "2"])
    assert r.exit_code == 0, r.output
    assert seen["loads"] == ["0.5"] and seen["workloads"] == [3] and seen["scale_policy"] == "pollux"
    assert (seen["scale_jobs"], seen["scale_nodes"], seen["scale_load_factor"], seen["scale_hours"]) == (100, 10, 2, 6)


@pytest.mark.usefixtures("nothing_runs")
def test_bench_sim_checks_its_out_file_before_any_run(tmp_path: Path) -> None:
    """Was: the whole run, its tables printed, then FileNotFoundError (exit 1) and no JSON."""
    refused(["bench", "sim", "--parts", "cpu", "--out", str(tmp_path / "no-such-folder" / "x.json")], "--out")
    refused(["bench", "sim", "--parts", "cpu", "--out", str(tmp_path)], "--out")


@pytest.mark.usefixtures("nothing_runs")
def test_sim_run_refuses_a_repair_time_when_no_node_is_lost(one_job: Path) -> None:
    """Was: --repair-s 5 with neither --fail-rate nor --fail-at ran and ignored it."""
    line = refused(["sim", "run", "--workload", str(one_job), "--repair-s", "5"], "--repair-s")
    assert "--fail-rate or --fail-at" in line


def test_sim_run_takes_a_repair_time_with_losses(one_job: Path) -> None:
    for extra in (["--fail-at", "60:n00"], ["--fail-rate", "0.1"]):
        args = ["sim", "run", "--workload", str(one_job), "--repair-s", "5", *extra, "-o", "json"]
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output


@pytest.mark.usefixtures("nothing_runs")
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--workloads", "5,5"], "--workloads"),  # was: run twice, restarts summed twice, "0/2" workloads met
        (["--loads", "0.5,0.5"], "--loads"),
        (["--policies", "sluice,pollux,sluice"], "--policies"),
        (["--cpu-policies", "kube,kube"], "--cpu-policies"),
    ],
)
def test_bench_sim_refuses_a_name_given_twice(args: list[str], flag: str) -> None:
    assert "more than once" in refused(["bench", "sim", *args], flag)


@pytest.mark.usefixtures("nothing_runs")
def test_sim_profile_checks_its_out_file_before_profiling(tmp_path: Path) -> None:
    """Was: the example profiled for real at every limit, then FileNotFoundError (exit 1), nothing saved."""
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ncommand: [python, x.py]\n")
    refused(["sim", "profile", str(spec), "--out", str(tmp_path / "no-such-folder" / "p.json")], "--out")
    refused(["sim", "profile", str(spec), "--out", str(tmp_path)], "--out")
