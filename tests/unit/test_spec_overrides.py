"""`sluice job submit --set FIELD=VALUE` and `--env NAME=VALUE`: a spec file's fields changed for
one submit, checked as if written in the file. Attacked with paths through things that are not
mappings, values YAML cannot read, names of fields that do not exist and sluice's own variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.spec import SpecError
from sluice.spec.loading import load_job_spec
from sluice.spec.overrides import apply_overrides, parse_assignment, parse_value

SPEC = """\
name: sweep
command: ["python", "train.py"]
resources:
  cpu: 1
env: {LR: "0.1"}
"""


def problems(err: pytest.ExceptionInfo[SpecError]) -> list[tuple[str, str]]:
    return [(p.field, p.problem) for p in err.value.problems]


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


def test_fields_are_set_made_on_the_way_and_checked_as_in_the_file(spec: Path) -> None:
    job = load_job_spec(
        spec,
        [
            ("resources.cpu", parse_value("resources.cpu", "{min: 1, max: 4}")),
            ("checkpoint.interval_s", parse_value("checkpoint.interval_s", "60")),  # no checkpoint: in the file
            ("env.LR", "0.01"),  # --env: text as it is
            ("env.MODEL_SIZE", "big"),
            ("labels.sluice.speedup-group", "mlp"),  # one key, dots and all
            ("command", parse_value("command", "[python, other.py]")),
            ("workdir", "sub"),  # relative to the spec file's folder, as in the file
        ],
    )
    assert (job.resources.cpu.min, job.resources.cpu.max) == (1, 4)
    assert job.checkpoint.interval_s == 60 and job.command == ["python", "other.py"]
    assert job.env["LR"] == "0.01" and job.env["MODEL_SIZE"] == "big"
    assert job.labels == {"sluice.speedup-group": "mlp"}
    assert job.workdir == str(spec.parent / "sub")
    assert load_job_spec(spec).env == {"LR": "0.1"}  # the file itself is untouched


def test_the_last_of_two_changes_to_one_field_wins_and_the_file_data_is_not_changed() -> None:
    data = {"resources": {"cpu": {"min": 1}}}
    out = apply_overrides(data, [("resources.cpu.max", 2), ("resources.cpu.max", 3)])
    assert out == {"resources": {"cpu": {"min": 1, "max": 3}}} and data == {"resources": {"cpu": {"min": 1}}}


def test_bad_changes_name_their_field_and_say_what_to_do(spec: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_job_spec(spec, [("resources.cpu.max", 4)])  # cpu: 1 in the file is a number
    assert problems(err) == [
        ("resources.cpu.max", "resources.cpu is 1, not a mapping: set resources.cpu whole instead")
    ]
    with pytest.raises(SpecError) as err:
        load_job_spec(spec, [("command.0", "python3")])
    assert "command is a list, not a mapping" in problems(err)[0][1]
    with pytest.raises(SpecError) as err:
        load_job_spec(spec, [("bogus", 1), ("resources.gpus", parse_value("resources.gpus", "-1"))])
    fields = [f for f, _ in problems(err)]
    assert "bogus" in fields and "resources.gpus" in fields
    with pytest.raises(SpecError) as err:  # sluice's own variables stay sluice's
        load_job_spec(spec, [("env.SLUICE_JOB_ID", "j-other")])
    assert problems(err)[0][0] == "env"
    with pytest.raises(SpecError) as err:
        parse_value("resources.cpu", "{min: 1, min: 2}")  # a key twice, as in a file
    assert problems(err)[0][0] == "resources.cpu"
    with pytest.raises(SpecError) as err:
        parse_value("command", "[python")
    assert problems(err)[0][0] == "command" and "not a value YAML can read" in problems(err)[0][1]
    for bad in ("=3", "noequals", " =x"):
        with pytest.raises(SpecError) as err:
            parse_assignment(bad, "--set")
        assert problems(err)[0][0] == "--set"
    for path in ("resources..cpu", ".name", "name."):
        with pytest.raises(SpecError) as err:
            apply_overrides({}, [(path, 1)])
        assert problems(err)[0] == (path, "a field path has a name between each two dots")
    assert parse_assignment("env.A=b=c", "--set") == ("env.A", "b=c")  # split at the first '='
    assert parse_value("name", "'007'") == "007" and parse_value("name", "007") == 7
