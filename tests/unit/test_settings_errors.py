"""Bad SLUICE_* values are refused in one line naming the variable (and the settings.yaml
key), and no setting is infinite or NaN (walkthrough 4: `SLUICE_KPI_SAMPLE_S=inf` silently
stopped health sampling; a raw pydantic dump named only the field)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.settings import Settings, SettingsError, load_settings, misspelled_variables


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("SLUICE_HEALTH_TRAIN_SAMPLES", "abc", "valid integer"),
        ("SLUICE_KPI_SAMPLE_S", "inf", "finite"),
        ("SLUICE_STOP_GRACE_S", "nan", "finite"),
        ("SLUICE_POLICY_INTERVAL_S", "1e309", "finite"),
        # Finite but as good as infinite: sampling or reconciling stopped, every alarm held, a
        # stopped job never killed, KPI rows kept without end before a fit (ops walk s31).
        ("SLUICE_KPI_SAMPLE_S", "1e300", "less than or equal to 3600"),
        ("SLUICE_USAGE_SAMPLE_S", "1e300", "less than or equal to 3600"),
        ("SLUICE_RECONCILE_INTERVAL_S", "1e9", "less than or equal to 60"),
        ("SLUICE_HEALTH_CHANGE_GRACE_S", "1e300", "less than or equal to 3600"),
        ("SLUICE_STOP_GRACE_S", "1e300", "less than or equal to 86400"),
        ("SLUICE_HEALTH_TRAIN_SAMPLES", "1000000000", "less than or equal to 86400"),
    ],
)
def test_a_bad_setting_is_named_by_its_variable(
    var: str, value: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=f"{var}.*{says}"):
        load_settings()
    r = CliRunner().invoke(app, ["up", "--port", "8799"])
    assert r.exit_code == 2 and f"error: {var}" in r.output and "pydantic" not in r.output, r.output


def test_a_bad_key_in_settings_yaml_is_named_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_text("stop_grace_s: .inf\n")
    monkeypatch.setenv("SLUICE_HOME", str(home))
    with pytest.raises(SettingsError, match=r"SLUICE_STOP_GRACE_S or `stop_grace_s` in .*settings.yaml: .*finite"):
        load_settings()


def test_a_relative_home_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`SLUICE_HOME=h` named a different folder to each process that resolved it against its
    own working folder (the plane, the job supervisors, the jobs): every job failed to launch."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLUICE_HOME", "h")
    assert Settings().home == tmp_path / "h"
    assert Settings(home=Path("~/x")).home == Path.home() / "x"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("polcy: kube\n", r"`polcy` in .*settings.yaml is not a setting; did you mean `policy`\?"),
        ("cache_disk_bytes: 10\n", r"read from the environment only \(SLUICE_CACHE_DISK_BYTES\)"),
        ("- policy: kube\n", r"settings.yaml: expected a mapping of settings \(key: value\), got list"),
        # It said `error: ParserError: ... in "<unicode string>"`, naming no file.
        ("policy: [kube\n", r"settings.yaml is not valid YAML: .*\(line 2, column 1\)"),
        # Both were taken silently: the last of two values, and a home that moved the state.
        ("policy: kube\npolicy: sluice\n", r"settings.yaml is not valid YAML: duplicate key 'policy' \(first at"),
        ("home: /tmp/elsewhere\n", r"`home` in .*settings.yaml: .*set SLUICE_HOME instead"),
    ],
)
def test_settings_yaml_refuses_what_it_would_ignore(
    text: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A typo in settings.yaml (`polcy: kube`) was silently ignored: the plane ran flowcon.
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_text(text)
    monkeypatch.setenv("SLUICE_HOME", str(home))
    with pytest.raises(SettingsError, match=says):
        load_settings()
    r = CliRunner().invoke(app, ["up", "--port", "8799"])
    assert r.exit_code == 2 and "settings.yaml" in r.output, r.output


def test_up_warns_of_a_variable_that_is_a_near_miss_of_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `SLUICE_POLCY=kube sluice up` ran flowcon without a word: pydantic-settings ignores it.
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLUICE_POLCY", "kube")
    r = CliRunner().invoke(app, ["up", "--policy", "bogus"])  # stops at the policy, after the warning
    assert r.exit_code == 2
    assert "warning: SLUICE_POLCY is not a setting, so it is ignored; did you mean SLUICE_POLICY?" in r.output
    # Variables that are not settings and no near miss are left alone.
    env = {"SLUICE_TOKEN": "x", "SLUICE_CACHE_DISK_BYTES": "1", "SLUICE_EXAMPLE_SCALE": "0.1", "SLUICE_PORT": "1"}
    env["SLUICE_CHECKPOINT_DIR"] = "/x"  # a job's (sluice.sdk), near checkpoint_roots
    assert misspelled_variables(env) == []


def test_settings_yaml_that_is_not_text_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It said `error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff`, naming no file.
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.yaml").write_bytes(b"\xff\xfe policy: kube\n")
    monkeypatch.setenv("SLUICE_HOME", str(home))
    with pytest.raises(SettingsError, match=r"settings.yaml is not UTF-8 text"):
        load_settings()
    r = CliRunner().invoke(app, ["up", "--port", "8799"])
    assert r.exit_code == 2 and "settings.yaml" in r.output, r.output


@pytest.mark.parametrize(
    ("env", "says"),
    [
        # A traceback from the server (`ValueError: engine: unknown engine 'k8s'`) (ops walk s31).
        ({"SLUICE_ENGINE": "k8s"}, r"^SLUICE_ENGINE: Input should be 'local' or 'ray'; got 'k8s'$"),
        # `SLUICE_?: Value error, job_uid_max (1000) is below job_uid_min (410000)`.
        (
            {"SLUICE_JOB_UID_MIN": "410000", "SLUICE_JOB_UID_MAX": "1000"},
            r"^SLUICE_JOB_UID_MAX \(`job_uid_max`, 1000\) is below SLUICE_JOB_UID_MIN \(`job_uid_min`, 410000\)$",
        ),
        # `error: SettingsError: error parsing value for field "checkpoint_roots" from source ...`.
        (
            {"SLUICE_CHECKPOINT_ROOTS": "/mnt/ckpt"},
            r"^SLUICE_CHECKPOINT_ROOTS: not valid JSON; a list setting takes a JSON list, .*; got '/mnt/ckpt'$",
        ),
    ],
)
def test_a_setting_the_server_took_badly_is_named_at_load(
    env: dict[str, str], says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError, match=says):
        load_settings()
    r = CliRunner().invoke(app, ["up", "--port", "8799"])
    assert r.exit_code == 2 and "error: SLUICE_" in r.output and "SettingsError" not in r.output, r.output
