"""`sluice queue ...`: Queues with quotas, cohorts and grants (docs/queues.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from sluice.cli.client import EXIT_USAGE, CliError, connect
from sluice.cli.output import Output, OutputOpt, console, emit, err_console, errors_reported, table
from sluice.client import BadRequestError
from sluice.spec import GrantSpec, QueuePatch, QueueSpec, SpecError
from sluice.spec.loading import parse_model

M = TypeVar("M", bound=BaseModel)

app = typer.Typer(help="Queues with quotas, cohorts and grants.", no_args_is_help=True)

QueueName = Annotated[str, typer.Argument(help="The queue's name.")]
Cores = Annotated[float | None, typer.Option(help="Nominal quota: guaranteed cores (cpu.min x replicas).")]
Memory = Annotated[int | None, typer.Option("--memory-mb", help="Nominal quota: memory in MiB.")]
Gpus = Annotated[int | None, typer.Option(help="Nominal quota: GPUs.")]
Jobs = Annotated[int | None, typer.Option(help="Nominal quota: admitted jobs.")]
Cohort = Annotated[str | None, typer.Option(help="Cohort whose queues lend each other unused quota.")]
BorrowCores = Annotated[float | None, typer.Option(help="Most cores it may borrow above its nominal quota.")]
BorrowGpus = Annotated[int | None, typer.Option(help="Most GPUs it may borrow above its nominal quota.")]
LendCores = Annotated[float | None, typer.Option(help="Most of its unused cores others may borrow.")]
LendGpus = Annotated[int | None, typer.Option(help="Most of its unused GPUs others may borrow.")]
Weight = Annotated[float | None, typer.Option(help="Fair-share weight within its cohort, 0.001 to 1000.")]
ReclaimOpt = Annotated[
    str | None,
    typer.Option(
        "--reclaim",
        help="Its jobs within nominal quota preempt other queues' borrowers: any, lower_priority or never.",
    ),
]
MaxRuntimeOpt = Annotated[
    str | None,
    typer.Option(
        "--max-runtime-s",
        metavar="SECONDS|none",
        help="Most seconds one of its jobs may run: a job without max_runtime_s gets it, one asking for more is "
        "refused; 'none' removes it (set). Jobs already running are held to a new limit too.",
    ),
]
WithinOpt = Annotated[
    str | None,
    typer.Option("--within-queue", help="Its jobs preempt its own lower-priority jobs: lower_priority or never."),
]


def _runtime(value: str | None) -> dict[str, float | None]:
    """--max-runtime-s as a request field: seconds, or None ('none': no limit); {} when not given."""
    if value is None:
        return {}
    if value.strip().lower() == "none":
        return {"max_runtime_s": None}
    try:
        return {"max_runtime_s": float(value)}
    except ValueError:
        raise CliError(f"--max-runtime-s: {value!r} is not a number of seconds or 'none'", EXIT_USAGE) from None


def _quota(**kw: float | None) -> dict[str, float] | None:
    out = {k: v for k, v in kw.items() if v is not None}
    return out or None


def _fields(
    cohort: str | None,
    cores: float | None,
    memory_mb: int | None,
    gpus: int | None,
    jobs: int | None,
    borrow_cores: float | None,
    borrow_gpus: int | None,
    lend_cores: float | None,
    lend_gpus: int | None,
    weight: float | None,
    reclaim: str | None = None,
    within_queue: str | None = None,
) -> dict[str, Any]:
    preemption = {"reclaim_within_cohort": reclaim, "within_queue": within_queue}
    fields: dict[str, Any] = {
        "preemption": {k: v for k, v in preemption.items() if v is not None} or None,
        "cohort": cohort,
        "nominal": _quota(cores=cores, memory_mb=memory_mb, gpus=gpus, jobs=jobs),
        "borrowing_limit": _quota(cores=borrow_cores, gpus=borrow_gpus),
        "lending_limit": _quota(cores=lend_cores, gpus=lend_gpus),
        "weight": weight,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _parsed(model: type[M], raw: dict[str, Any], what: str) -> M:
    """The request model, or a usage error listing every field problem, each by its flag."""
    try:
        return parse_model(model, raw)
    except SpecError as err:
        raise CliError(what, EXIT_USAGE, [_by_flag(p.field, p.problem) for p in err.problems]) from None


@contextmanager
def _server_problems_by_flag(what: str) -> Iterator[None]:
    """What only the server judges (a lending limit above the nominal quota, a cohort's
    sums) said the same way: by the flag the user gave, not the API's field."""
    try:
        yield
    except BadRequestError as err:
        if not err.problems:
            raise
        raise CliError(what, EXIT_USAGE, [_by_flag(p.field, p.problem) for p in err.problems]) from None


_TOP_FLAGS = {"cohort": "--cohort", "weight": "--weight", "max_runtime_s": "--max-runtime-s", "name": "NAME"}


def _by_flag(field: str, problem: str) -> dict[str, str]:
    """A problem named by the command's flag (`--lend-cores`), where the API names its field
    (`lending_limit.cores`): a user of the CLI never wrote the latter."""
    head, _, rest = field.partition(".")
    flag = _FLAGS.get(head, {}).get(rest) if rest else _TOP_FLAGS.get(head)
    if flag is None and head in _FLAGS:
        flag = "/".join(_FLAGS[head].values())  # the whole limit: its flags
    return {"field": flag or field, "problem": problem}


def _render_one(q: dict[str, Any]) -> None:
    console.print(f"queue {q['name']}: {q['summary']}", markup=False)


@app.command()
def create(
    name: QueueName,
    cohort: Cohort = None,
    cores: Cores = None,
    memory_mb: Memory = None,
    gpus: Gpus = None,
    jobs: Jobs = None,
    borrow_cores: BorrowCores = None,
    borrow_gpus: BorrowGpus = None,
    lend_cores: LendCores = None,
    lend_gpus: LendGpus = None,
    weight: Weight = None,
    reclaim: ReclaimOpt = None,
    within_queue: WithinOpt = None,
    max_runtime_s: MaxRuntimeOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create a queue (admin). A resource without a quota is not limited."""
    with errors_reported():
        raw = {
            "name": name,
            **_fields(
                cohort,
                cores,
                memory_mb,
                gpus,
                jobs,
                borrow_cores,
                borrow_gpus,
                lend_cores,
                lend_gpus,
                weight,
                reclaim,
                within_queue,
            ),
            **_runtime(max_runtime_s),
        }
        spec = _parsed(QueueSpec, raw, "invalid queue")
        with connect(admin=True) as client, _server_problems_by_flag("invalid queue (refused by the server)"):
            q = client.create_queue(spec)
    emit(q, output, _render_one)


@app.command("set")
def set_(
    name: QueueName,
    cohort: Annotated[str | None, typer.Option(help="Move it to this cohort ('' takes it out of any).")] = None,
    cores: Cores = None,
    memory_mb: Memory = None,
    gpus: Gpus = None,
    jobs: Jobs = None,
    borrow_cores: BorrowCores = None,
    borrow_gpus: BorrowGpus = None,
    lend_cores: LendCores = None,
    lend_gpus: LendGpus = None,
    weight: Weight = None,
    reclaim: ReclaimOpt = None,
    within_queue: WithinOpt = None,
    max_runtime_s: MaxRuntimeOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change a queue live (admin): the next round admits by the new quotas. A nominal quota
    given replaces the old one: give every resource you want limited. Preemption settings
    given replace both (one left out goes back to its default)."""
    with errors_reported():
        raw = _fields(
            cohort,
            cores,
            memory_mb,
            gpus,
            jobs,
            borrow_cores,
            borrow_gpus,
            lend_cores,
            lend_gpus,
            weight,
            reclaim,
            within_queue,
        )
        raw.update(_runtime(max_runtime_s))
        patch = _parsed(QueuePatch, raw, "invalid queue change")
        with connect(admin=True) as client, _server_problems_by_flag("invalid queue change (refused by the server)"):
            before = next((q for q in client.queues() if q.name == name), None) if raw.keys() & _REPLACED else None
            q = client.update_queue(name, patch)
    if before is not None:
        for note in _dropped(before.model_dump(), q.model_dump(), raw):
            err_console.print(f"note: queue {name}: {note}", markup=False)
    emit(q, output, _render_one)


_REPLACED = {"nominal", "borrowing_limit", "lending_limit", "preemption"}
"""Fields of a queue change that replace the whole setting: a part left out is dropped."""

_FLAGS = {
    "nominal": {"cores": "--cores", "memory_mb": "--memory-mb", "gpus": "--gpus", "jobs": "--jobs"},
    "borrowing_limit": {"cores": "--borrow-cores", "gpus": "--borrow-gpus"},
    "lending_limit": {"cores": "--lend-cores", "gpus": "--lend-gpus"},
    "preemption": {"reclaim_within_cohort": "--reclaim", "within_queue": "--within-queue"},
}
_WORDS = {"nominal": "nominal quota", "borrowing_limit": "borrowing limit", "lending_limit": "lending limit"}


def _dropped(before: dict[str, Any], after: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """What a change took away without being asked to, each with the flag that keeps it: a
    quota given replaces the old one (`--cores 12` drops `gpus=4`), and preemption settings
    given replace both (`--reclaim never` puts within_queue back to its default)."""
    notes = []
    for field in ("nominal", "borrowing_limit", "lending_limit"):
        if field not in raw:
            continue
        for key, old in before[field].items():
            if key not in after[field]:
                flag = _FLAGS[field].get(key, key)
                notes.append(
                    f"its {_WORDS[field]} of {key} ({old:g}) is gone: a quota given replaces the old one; "
                    f"add {flag} {old:g} to keep it"
                )
    if "preemption" in raw:
        for key, flag in _FLAGS["preemption"].items():
            if key not in raw["preemption"] and before[key] != after[key]:
                notes.append(
                    f"{key} went back to {after[key]} (was {before[key]}); add {flag} {before[key]} to keep it"
                )
    return notes


@app.command()
def grant(
    name: QueueName,
    tenant: Annotated[str, typer.Argument(help="The tenant that may submit to it.")],
    revoke: Annotated[bool, typer.Option("--revoke", help="Take the grant back instead.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Let a tenant submit to a queue (admin)."""
    with errors_reported():
        g = _parsed(GrantSpec, {"tenant": tenant, "granted": not revoke}, "invalid grant")
        with connect(admin=True) as client:
            q = client.grant_queue(name, g.tenant, g.granted)
    emit(
        q, output, lambda q: console.print(f"queue {q['name']}: tenants {', '.join(q['tenants']) or '-'}", markup=False)
    )


@app.command()
def delete(name: QueueName) -> None:
    """Delete a queue (admin); it must have no unfinished jobs."""
    with errors_reported(), connect(admin=True) as client:
        client.delete_queue(name)
    console.print(f"deleted queue {name}", markup=False)


def _amounts(d: dict[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in d.items() if v) or "-"


def _limits(d: dict[str, float]) -> str:
    """Limits as set, zeros included (a borrowing limit of 0 means something)."""
    return " ".join(f"{k}={v:g}" for k, v in d.items()) or "-"


def _limits_cell(q: dict[str, Any]) -> str:
    """'borrow cores=4; lend cores=2' or '-': the BORROW/LEND column of `queue list`."""
    parts = [f"borrow {_limits(q['borrowing_limit'])}"] if q["borrowing_limit"] else []
    parts += [f"lend {_limits(q['lending_limit'])}"] if q["lending_limit"] else []
    return "; ".join(parts) or "-"


@app.command("list")
def list_(output: OutputOpt = Output.table) -> None:
    """Queues with their quotas, borrowing and lending limits, usage, what they borrow and how
    many jobs wait. Read with admin.token where it is readable (every queue), as `queue create`
    writes with it; SLUICE_TOKEN set: that tenant's granted queues."""
    with errors_reported(), connect(admin=True) as client:
        queues = client.queues()

    def render(rows: list[dict[str, Any]]) -> None:
        table(
            ["NAME", "COHORT", "WEIGHT", "NOMINAL", "LIMITS", "USAGE", "BORROWED", "ADMITTED", "PENDING", "TENANTS"],
            [
                [
                    q["name"],
                    q["cohort"] or "",
                    f"{q['weight']:g}",
                    _amounts(q["nominal"]) if q["nominal"] else "no quota",
                    _limits_cell(q),
                    _amounts(q["usage"]),
                    _amounts(q["borrowed"]),
                    q["admitted"],
                    q["pending"],
                    "everyone" if q["tenants"] is None else ", ".join(q["tenants"]) or "-",
                ]
                for q in rows
            ],
        )

    emit(queues, output, render)


@app.command()
def get(name: QueueName, output: OutputOpt = Output.table) -> None:
    """One queue (admin: any; a tenant: one granted to it): its quota, borrowing and lending
    limits, preemption settings, usage and backlog."""
    with errors_reported(), connect(admin=True) as client:
        queues = [q for q in client.queues() if q.name == name]
        if not queues:  # a queue not granted reads like one that does not exist
            raise CliError(f"queue {name!r} not found")

    def render(q: dict[str, Any]) -> None:
        rows = [
            ("queue", q["name"]),
            ("summary", q["summary"]),
            ("cohort", q["cohort"] or "-"),
            ("weight", f"{q['weight']:g}"),
            ("nominal", _limits(q["nominal"]) if q["nominal"] else "no quota"),
            ("borrowing limit", _limits(q["borrowing_limit"]) if q["borrowing_limit"] else "-"),
            ("lending limit", _limits(q["lending_limit"]) if q["lending_limit"] else "-"),
            ("preemption", f"reclaim_within_cohort={q['reclaim_within_cohort']}, within_queue={q['within_queue']}"),
            ("max runtime", "-" if q.get("max_runtime_s") is None else f"{q['max_runtime_s']:g}s"),
            ("usage", _amounts(q["usage"])),
            ("borrowed", _amounts(q["borrowed"])),
            ("admitted", str(q["admitted"])),
            ("pending", str(q["pending"])),
            ("tenants", "everyone" if q["tenants"] is None else ", ".join(q["tenants"]) or "-"),
        ]
        for k, v in rows:
            console.print(f"{k + ':':<17}{v}", markup=False)

    emit(queues[0], output, render)
