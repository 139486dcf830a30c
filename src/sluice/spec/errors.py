"""One error type for every bad spec, carrying the field path and the problem."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FieldProblem:
    """A single problem with one field: `field` is a dotted path such as `resources.cpu.min`."""

    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


class SpecError(ValueError):
    """Raised when a spec cannot be accepted. `problems` names each bad field."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))

    def as_dict(self) -> dict[str, object]:
        """The JSON body the API returns for a 422."""
        return {
            "error": "invalid spec",
            "problems": [{"field": p.field, "problem": p.problem} for p in self.problems],
        }
