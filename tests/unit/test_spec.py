import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.spec import SpecError, parse_job_spec
from sluice.spec.loading import MAX_SPEC_BYTES, load_yaml_text


def fields(err: SpecError) -> set[str]:
    return {p.field for p in err.problems}


def test_minimal_spec_has_defaults() -> None:
    spec = parse_job_spec({"command": ["python", "train.py"]})
    assert spec.resources.cpu.min == 1.0 and spec.max_restarts == 3 and spec.name == "job"


def test_replicas_keep_the_global_batch_unless_told_to_scale() -> None:
    replicas = parse_job_spec({"command": ["x"], "resources": {"replicas": {"max": 2}}}).resources.replicas
    assert (replicas.batch, replicas.global_batch) == ("keep_global", None)


def test_cpu_shorthand() -> None:
    assert parse_job_spec({"command": ["x"], "resources": {"cpu": 0.5}}).resources.cpu.min == 0.5


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"command": ["x"], "bogus": 1}, "bogus", "unknown field"),
        ({"command": ["x"], "max_restarts": "many"}, "max_restarts", "integer"),
        ({"command": ["x"], "resources": {"cpu": {"min": -1}}}, "resources.cpu.min", "greater than 0"),
        ({"name": "a"}, "command", "missing"),
        ({"command": "python train.py"}, "command", "shell string"),
        ({"command": ["bash", "-c", "rm -rf /"]}, "command", "shell"),
        ({"command": []}, "command", "at least 1"),
        ({"command": ["x"], "resources": {"cpu": {"min": 2, "max": 1}}}, "resources.cpu", "smaller than min"),
        ({"command": ["x"], "env": {"SLUICE_JOB_ID": "1"}}, "env", "set by sluice"),
        ({"command": ["x"], "name": "Bad Name!"}, "name", "pattern"),
        (
            {"command": ["x"], "resources": {"replicas": {"max": 2, "batch": "keep"}}},
            "resources.replicas.batch",
            "keep_global (the global batch stays",
        ),
        (
            {"command": ["x"], "resources": {"replicas": {"max": 4, "global_batch": 3}}},
            "resources.replicas",
            "smaller than the most replicas (4)",
        ),
        (
            {"command": ["x"], "resources": {"replicas": {"min": 2, "batch": "scale", "global_batch": 5}}},
            "resources.replicas",
            "does not split evenly over min (2)",
        ),
    ],
)
def test_bad_specs_name_the_field(data: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(data)
    assert field in fields(info.value)
    assert words in str(info.value)


def test_oversized_spec_refused_before_parsing() -> None:
    with pytest.raises(SpecError, match="larger than"):
        load_yaml_text("a: " + "x" * (MAX_SPEC_BYTES + 1))


def test_non_mapping_refused() -> None:
    with pytest.raises(SpecError, match="expected a mapping"):
        parse_job_spec(["command"])


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.integers() | st.text(max_size=5), max_size=4))
def test_arbitrary_input_either_parses_or_names_fields(data: dict) -> None:
    try:
        parse_job_spec(data)
    except SpecError as err:
        assert err.problems and all(p.field for p in err.problems)
