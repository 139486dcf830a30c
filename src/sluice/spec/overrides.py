"""Changing fields of a spec file from the command line (`sluice job submit --set`, `--env`).

A sweep or a quick retry changes one or two fields of a spec that is otherwise right: a
learning rate, a CPU ceiling, a queue. Editing a copy of the file for each is how mistakes
are made; Slurm's `sbatch --time`, Helm's `--set` and Hydra's `key=value` are what users
know. The changes are made to the file's mapping before it is validated, so a value given
here is checked exactly as one written in the file, and a problem names its field.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import yaml

from sluice.spec.errors import FieldProblem, SpecError

FLAT_MAPPINGS = ("env", "labels")
"""Fields whose keys are the user's own names (an environment variable, a label such as
`sluice.speedup-group`): everything after `env.` or `labels.` is one key, dots included."""


def parse_assignment(text: str, option: str, form: str = "FIELD=VALUE, e.g. resources.cpu.max=4") -> tuple[str, str]:
    """`PATH=VALUE` split at its first `=`; a SpecError naming `option` and its `form` otherwise."""
    path, eq, value = text.partition("=")
    if not eq or not path.strip():
        raise SpecError([FieldProblem(option, f"{text!r}: write {form}")])
    return path.strip(), value


def parse_value(path: str, text: str) -> Any:
    """The value of `--set PATH=TEXT` as YAML reads it: `4` a number, `true` a boolean, `[a, b]`
    a list, `{min: 1, max: 4}` a mapping, anything else text (quote it to keep `007` text)."""
    from sluice.spec.loading import safe_load_unique  # the loader of spec files (one key once)

    try:
        return safe_load_unique(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "not a YAML value"
        raise SpecError([FieldProblem(path, f"{text!r} is not a value YAML can read ({problem})")]) from None


def _keys(path: str) -> list[str]:
    head, _, rest = path.partition(".")
    parts = [head, rest] if head in FLAT_MAPPINGS and rest else path.split(".")
    if any(not p for p in parts):
        raise SpecError([FieldProblem(path, "a field path has a name between each two dots")])
    return parts


def apply_overrides(data: dict[str, Any], changes: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A copy of `data` with each (dotted path, value) set, in order, making the mappings on the
    way that the file left out. Setting inside something that is not a mapping (a number, a
    list) is a SpecError naming the path: give that field whole instead."""
    out: dict[str, Any] = copy.deepcopy(data)  # each submit changes its own copy
    for path, value in changes:
        keys = _keys(path)
        here = out
        for depth, key in enumerate(keys[:-1]):
            nxt = here.get(key)
            if nxt is None:
                nxt = here[key] = {}
            if not isinstance(nxt, dict):
                whole = ".".join(keys[: depth + 1])
                raise SpecError(
                    [FieldProblem(path, f"{whole} is {_what(nxt)}, not a mapping: set {whole} whole instead")]
                )
            here = nxt
        here[keys[-1]] = value
    return out


def _what(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return f"{value!r}"
