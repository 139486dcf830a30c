from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

import sluice.spec
from sluice.spec import (
    DatasetSpec,
    PriorityClassSpec,
    QueuePatch,
    QueueSpec,
    SpecError,
    TenantPatch,
    TenantSpec,
    parse_job_spec,
)
from sluice.spec.base import SpecModel
from sluice.spec.loading import MAX_SPEC_BYTES, load_job_spec, load_yaml_text, parse_model


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
        ({"command": ["x"], "name": "Bad Name!"}, "name", "'Bad Name!' is not a valid name: use 1 to 63 lowercase"),
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


# --------------------------------------------------------------------------- booleans are not numbers


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"resources": {"cpu": {"min": True, "max": 1}}}, "resources.cpu.min"),
        ({"resources": {"cpu": {"max": False}}}, "resources.cpu.max"),
        ({"resources": {"cpu": True}}, "resources.cpu"),
        ({"resources": {"gpus": True}}, "resources.gpus"),
        ({"resources": {"replicas": {"min": True}}}, "resources.replicas.min"),
        ({"priority": True}, "priority"),
        ({"max_restarts": False}, "max_restarts"),
        ({"qoe": {"loss": True}}, "qoe.loss"),
    ],
)
def test_a_boolean_is_not_a_number(data: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec({"command": ["x"], **data})
    assert field in fields(info.value)
    assert "not true" in str(info.value) or "not false" in str(info.value)


def _spec_models() -> list[type[BaseModel]]:
    found = {m for m in vars(sluice.spec).values() if isinstance(m, type) and issubclass(m, SpecModel)}
    for model in list(found):
        for f in model.model_fields.values():
            found.update(a for a in (f.annotation, *getattr(f.annotation, "__args__", ())) if _is_spec(a))
    return sorted(found, key=lambda m: m.__name__)


def _is_spec(a: object) -> bool:
    return isinstance(a, type) and issubclass(a, SpecModel)


def test_every_number_field_of_every_spec_refuses_a_boolean() -> None:
    checked = 0
    for model in _spec_models():
        for name, f in model.model_fields.items():
            members = {f.annotation, *getattr(f.annotation, "__args__", ())}
            if not members & {int, float}:
                continue
            with pytest.raises(SpecError) as info:
                parse_model(model, {name: True})
            assert any(p.field == name and p.problem == "expected a number, not true" for p in info.value.problems), (
                model.__name__,
                name,
                info.value,
            )
            checked += 1
    assert checked >= 20  # CpuRange, ReplicaRange, Resources, QuotaSpec, TenantSpec, ... were all reached


def test_ints_quoted_numbers_and_real_booleans_still_read() -> None:
    spec = parse_job_spec(
        {"command": ["x"], "resources": {"cpu": {"min": 1, "max": "2.5"}, "gpus": 1.0}, "priority": "3"}
    )
    assert (spec.resources.cpu.min, spec.resources.cpu.max, spec.resources.gpus, spec.priority) == (1.0, 2.5, 1, 3)
    assert parse_model(TenantSpec, {"name": "t", "admin": True}).admin is True


# --------------------------------------------------------------------------- duplicate keys


def test_a_key_repeated_in_one_mapping_is_refused_naming_the_key_and_its_lines() -> None:
    with pytest.raises(SpecError) as info:
        load_yaml_text("command: [x]\npriority: 1\npriority: 2\n")
    assert str(info.value) == "(spec): not valid YAML at line 3, column 1: duplicate key 'priority' (first at line 2)"
    with pytest.raises(SpecError, match="duplicate key 'min'"):
        load_yaml_text("resources:\n  cpu: {min: 1, max: 2, min: 3}\n")


def test_the_same_key_in_different_mappings_and_merge_overrides_are_fine() -> None:
    assert load_yaml_text("a: {min: 1}\nb: {min: 2}\n") == {"a": {"min": 1}, "b": {"min": 2}}
    assert load_yaml_text("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n")["d"] == {"x": 3, "y": 2}


# --------------------------------------------------------------------------- names


NAME_RULE = "use 1 to 63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"


@pytest.mark.parametrize(
    ("model", "data", "field", "shown"),
    [
        (None, {"command": ["x"], "name": "MyJob"}, "name", "'MyJob'"),
        (None, {"command": ["x"], "name": "../../etc"}, "name", "'../../etc'"),
        (None, {"command": ["x"], "name": "a" * 5000}, "name", "'" + "a" * 40 + "'... (5000 characters)"),
        (None, {"command": ["x"], "queue": "Research"}, "queue", "'Research'"),
        (None, {"command": ["x"], "priority_class": "High"}, "priority_class", "'High'"),
        (None, {"command": ["x"], "datasets": [{"name": "-x"}]}, "datasets.0.name", "'-x'"),
        (TenantSpec, {"name": "Bob"}, "name", "'Bob'"),
        (QueueSpec, {"name": "q_"}, "name", "'q_'"),
        (QueueSpec, {"name": "q", "cohort": "Lab"}, "cohort", "'Lab'"),
        (QueuePatch, {"cohort": "Lab"}, "cohort", "'Lab'"),
        (PriorityClassSpec, {"name": "a" * 64, "value": 1}, "name", "'" + "a" * 40 + "'... (64 characters)"),
        (DatasetSpec, {"name": "My Data", "source": "/data"}, "name", "'My Data'"),
    ],
)
def test_a_bad_name_says_what_a_name_may_hold(
    model: type[BaseModel] | None, data: dict[str, Any], field: str, shown: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec(data) if model is None else parse_model(model, data)
    assert [str(p) for p in info.value.problems] == [f"{field}: {shown} is not a valid name: {NAME_RULE}"]
    assert "pattern" not in str(info.value)


def test_good_names_and_an_empty_cohort_still_read() -> None:
    assert parse_job_spec({"command": ["x"], "name": " a.b_c-9 "}).name == "a.b_c-9"
    assert parse_model(TenantSpec, {"name": "a" * 63}).name == "a" * 63
    assert parse_model(QueuePatch, {"cohort": ""}).cohort == ""


# --------------------------------------------------------------------------- words a user reads


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        # pydantic said `Input should be a valid dictionary or instance of CpuRange`: a class name.
        (
            {"resources": {"cpu": "two"}},
            "resources.cpu",
            "expected a number of cores or {min, max}, got the text 'two'",
        ),
        (
            {"resources": {"cpu": "500m"}},
            "resources.cpu",
            "Kubernetes quantity (millicores), which sluice does not read: write 0.5",
        ),
        (
            {"resources": {"replicas": 2}},
            "resources.replicas",
            "expected a mapping (fields: min, max, batch, global_batch), got the number 2",
        ),
        (
            {"checkpoint": 30},
            "checkpoint",
            "expected a mapping (fields: interval_s, keep, location), got the number 30",
        ),
        ({"datasets": ["digits"]}, "datasets.0", "expected a mapping (fields: name), got the text 'digits'"),
        # not "(fields: count, parallel, id, index)": id and index are sluice's, refused at submit
        ({"array": 8}, "array", "expected a mapping (fields: count, parallel), got the number 8"),
        ({"env": {"LR": 0.01}}, "env.LR", 'expected text, got the number 0.01: quote it ("0.01")'),
        # `--resume-from ""` said "String should match pattern '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'".
        ({"resume_from": ""}, "resume_from", "the text '' is not a job id (like j-1a2b3c4d5e"),
    ],
)
def test_type_errors_say_what_was_expected_and_what_was_given(data: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_job_spec({"command": ["x"], **data})
    assert any(p.field == field and words in p.problem for p in info.value.problems), info.value
    assert "instance of" not in str(info.value)


@pytest.mark.parametrize(("cpu", "cores"), [("2", 2.0), ("0.5", 0.5), (" 1.5 ", 1.5)])
def test_cpu_shorthand_reads_a_number_written_as_text(cpu: str, cores: float) -> None:
    # A spec reads "2" as 2 wherever a number goes; `cpu: "0.5"` was refused as not a mapping.
    assert parse_job_spec({"command": ["x"], "resources": {"cpu": cpu}}).resources.cpu.min == cores


def test_an_empty_spec_file_says_it_is_empty() -> None:
    # It said `expected a mapping, got NoneType`.
    with pytest.raises(SpecError, match="the spec is empty"):
        parse_job_spec(load_yaml_text(""))


def test_a_workdir_starting_with_a_tilde_is_refused_not_taken_as_a_folder_named_tilde(tmp_path: Path) -> None:
    # `workdir: ~/x` became <spec folder>/~/x and the job failed at launch.
    spec = tmp_path / "job.yaml"
    spec.write_text('command: ["python", "train.py"]\nworkdir: ~/x\n')
    with pytest.raises(SpecError) as info:
        load_job_spec(spec)
    assert fields(info.value) == {"workdir"} and "does not expand '~'" in str(info.value)


@pytest.mark.parametrize("cpu", ["9" * 400 + "m", "9" * 5000 + "m", " " * 50_000 + "500m"])
def test_cpu_in_millicores_of_any_length_is_a_short_problem(cpu: str) -> None:
    # 400 digits and an m raised OverflowError (an API 500), 5,000 quoted Python's integer
    # conversion limit, and the millicores message quoted what was given whole (50 kB of spaces).
    with pytest.raises(SpecError) as info:
        parse_job_spec({"command": ["x"], "resources": {"cpu": cpu}})
    [problem] = info.value.problems
    assert problem.field == "resources.cpu"
    assert len(problem.problem) < 200, problem.problem
    assert "set_int_max_str_digits" not in problem.problem


@pytest.mark.parametrize(
    "data",
    [
        {"env": {"BAD-" + "x" * 100_000: "1"}},
        {"env": {"SLUICE_" + "X" * 120: "1"}},
        {"resources": {"replicas": {"batch": "y" * 100_000}}},
        {"resources": {"replicas": {"batch": ["z" * 1000] * 90}}},
    ],
)
def test_a_refused_env_name_or_batch_mode_is_quoted_cut(data: dict) -> None:
    # They were quoted whole: a 100,000-character env name came back in the 422 whole.
    with pytest.raises(SpecError) as info:
        parse_job_spec({"command": ["x"], **data})
    assert all(len(p.problem) < 400 for p in info.value.problems), info.value


@pytest.mark.parametrize(
    ("model", "field", "hint"),
    [
        (QueuePatch, "cohort", '"" takes the queue out of its cohort'),
        (QueuePatch, "nominal", "{} removes every nominal quota"),
        (QueuePatch, "borrowing_limit", "{} removes every borrowing limit"),
        (QueuePatch, "lending_limit", "{} removes every lending limit"),
        (QueuePatch, "weight", None),
        (QueuePatch, "preemption", None),
        (TenantPatch, "weight", None),
        (TenantPatch, "max_running_jobs", "0 removes the limit"),
        (TenantPatch, "max_disk_mb", "0 removes the cap"),
    ],
)
def test_a_patch_refuses_null_where_null_means_nothing(model: type[BaseModel], field: str, hint: str | None) -> None:
    # `{"max_running_jobs": null}` was read as "not given": a 200 that changed nothing, while
    # `{"max_priority": null}` removes the cap. Only the fields that take null may have it.
    with pytest.raises(SpecError) as info:
        parse_model(model, {field: None})
    (problem,) = info.value.problems
    assert problem.field == field and "null is not a value here" in problem.problem
    assert hint is None or hint in problem.problem


def test_a_patch_still_takes_null_where_it_removes_something() -> None:
    assert parse_model(QueuePatch, {"max_runtime_s": None}).model_fields_set == {"max_runtime_s"}
    assert parse_model(TenantPatch, {"max_priority": None}).model_fields_set == {"max_priority"}
    assert parse_model(TenantPatch, {"max_running_jobs": 0}).max_running_jobs == 0
