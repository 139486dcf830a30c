"""`sluice job ...`: Submit, list, follow, cancel, delete and explain training jobs."""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sluice.cli.client import EXIT_FAILURE, EXIT_USAGE, CliError, connect, connect_for_job
from sluice.cli.output import (
    Output,
    OutputOpt,
    ago,
    as_cli_error,
    bad_input,
    console,
    emit,
    err_console,
    errors_reported,
    in_range,
    list_table,
    local_times,
    number,
    plain,
    report,
    shown_log,
    size_text,
    stamp,
    table,
    when,
)
from sluice.cli.plot import plot_job
from sluice.client import BadRequestError, Client, JobOut, SluiceError, UnreachableError
from sluice.client import Progress as ProgressOut
from sluice.model import Phase
from sluice.spec import SpecError, load_job_spec, parse_job_spec
from sluice.spec.job import job_ref
from sluice.spec.overrides import parse_assignment, parse_value

app = typer.Typer(help="Submit, list, follow, cancel, delete and explain training jobs.", no_args_is_help=True)

MAX_IDS = 1000
"""Most job ids one `job cancel` takes (each is one request)."""

MAX_TAIL_LINES = 100_000
"""Largest --tail (the API's bound too: sluice.api.job_logs.MAX_TAIL_LINES)."""

LIST_OPTIONAL = ("LOSS", "STEP", "CPU req/lim", "NODE", "TENANT")
"""`job list` columns a narrow terminal leaves out, first to last, before REASON is cut."""

JobId = Annotated[str, typer.Argument(help="The job's id (as `sluice job list` shows it).")]


def _nodes(job: dict[str, Any]) -> str:
    alloc = job.get("allocation") or []
    return ",".join(dict.fromkeys(a["node"] for a in alloc))


def _cpu(job: dict[str, Any]) -> str:
    alloc = job.get("allocation") or []
    if not alloc:
        return ""
    req = sum(a["cpu_request"] for a in alloc)
    limits = [a["cpu_limit"] for a in alloc]
    lim = "∞" if None in limits else number(sum(limits), 3)
    return f"{number(req, 3)}/{lim}"


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Job spec (YAML or JSON).", dir_okay=False)],
    resume_from: Annotated[
        str | None,
        typer.Option(help="Start from the newest checkpoint of this finished, cancelled or suspended job of yours."),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            help="Start only once this job of yours (or every job of this job array) has Succeeded (repeat for "
            "several; added to the spec's `after`). A job it starts after that ends otherwise cancels it."
        ),
    ] = None,
    after_any: Annotated[
        list[str] | None,
        typer.Option(
            help="Start only once this job of yours (or every job of this job array) has ended, however it "
            "ended (Slurm's afterany; repeat for several; added to the spec's `after_any`): a gather after a "
            "sweep some of whose runs may fail."
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            metavar="N[%K]",
            help="Make N jobs of this spec, told apart by SLUICE_ARRAY_INDEX (0 to N-1), at most K admitted at "
            "once (Slurm's --array=0-(N-1)%K; sets the spec's `array`). Prints the array's id; its jobs are "
            "<id>-0 to <id>-(N-1).",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="FIELD=VALUE",
            help="Change a field of the spec file for this submit (repeatable): a dotted path and a YAML value, "
            "e.g. resources.cpu.max=4, queue=research, checkpoint.interval_s=60, command='\\[python, b.py]'. "
            "Checked as if written in the file.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=VALUE",
            help="Set an environment variable of the job (repeatable; the value is taken as text, as is).",
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Validate a job spec here, then submit it. Prints the new job's id (an array's id for an
    array). `--set` and `--env` change the file's fields for this submit only (a sweep, a quick
    retry), applied in the order given, before the spec is checked."""
    with errors_reported():
        try:
            changes = [
                (path, parse_value(path, text)) for path, text in (parse_assignment(a, "--set") for a in set_ or [])
            ]
            changes += [
                (f"env.{name}", value)
                for name, value in (parse_assignment(a, "--env", "NAME=VALUE, e.g. LR=0.01") for a in env or [])
            ]
            spec = load_job_spec(file, changes)
            given: dict[str, object] = {}
            if array is not None:
                given["array"] = _array(array)
            if resume_from is not None:
                given["resume_from"] = resume_from
            if after:
                given["after"] = [*spec.after, *after]
            if after_any:
                given["after_any"] = [*spec.after_any, *after_any]
            if given:
                spec = parse_job_spec({**spec.model_dump(mode="json", exclude_unset=True), **given})
        except SpecError as err:
            raise CliError(f"invalid job spec {file}", EXIT_USAGE, [p.__dict__ for p in err.problems]) from None
        with connect() as client:
            try:
                job = client.submit(spec)
            except BadRequestError as err:
                if not err.problems:
                    raise
                # What only the server can judge (an unknown priority class or queue, a quota):
                # said like a local refusal, naming the file, so the user knows which spec.
                problems = [{"field": p.field, "problem": p.problem} for p in err.problems]
                raise CliError(f"invalid job spec {file} (refused by the server)", EXIT_USAGE, problems) from None
        emit(job, output, _submitted)


def _submitted(j: dict[str, Any]) -> None:
    """The new job's id, or its array's id (with where its jobs are, on stderr)."""
    a = j["spec"].get("array")
    if not a:
        typer.echo(j["id"])
        return
    typer.echo(a["id"])
    err_console.print(
        f"array {a['id']}: {a['count']} jobs, {a['id']}-0 to {a['id']}-{a['count'] - 1}{_turns(a)} "
        f"(sluice job list --array {a['id']})",
        markup=False,
    )


def _array_row(a: dict[str, Any]) -> str:
    """Which job of which array, and how many of them run at once."""
    return f"{a.get('index')} of {a['count']} in {a.get('id')}{_turns(a)}"


def _turns(a: dict[str, Any]) -> str:
    """How many of an array's jobs run at once, where it sets `parallel`."""
    return f", at most {a['parallel']} at once" if a.get("parallel") else ""


def _array(given: str) -> dict[str, int]:
    """--array N or N%K as the spec's `array`; a usage error otherwise."""
    m = re.fullmatch(r"([0-9]+)(?:%([0-9]+))?", given.strip())
    if m is None:
        raise CliError(f"--array: {given[:40]!r} is not N or N%K (N jobs, at most K at once)", EXIT_USAGE)
    out = {"count": _array_number(m.group(1))}
    if m.group(2) is not None:
        out["parallel"] = _array_number(m.group(2))
    return out


def _array_number(digits: str) -> int:
    """N or K of --array as a number; one of more than 7 digits as 10**7, past every bound, so
    that the spec refuses it as too large (naming array.count or array.parallel), as it does
    5000, rather than as no number at all (and no int() of thousands of digits is made)."""
    return int(digits) if len(digits) <= 7 else 10**7


def _labels(given: list[str]) -> dict[str, str]:
    """--label KEY=VALUE options as a mapping; a usage error for one without '=' or a key twice."""
    out: dict[str, str] = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise CliError(f"--label: {item[:60]!r} is not KEY=VALUE", EXIT_USAGE)
        if key in out and out[key] != value:
            raise CliError(f"--label: {key[:60]!r} is given two values; a job has one", EXIT_USAGE)
        out[key] = value
    return out


@app.command("list")
def list_(
    phase: Annotated[
        list[Phase] | None,
        typer.Option("--phase", "-p", case_sensitive=False, help="Only these phases (repeatable, any case)."),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only the jobs of this queue.")] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only this tenant's jobs (an admin token sees every tenant's).")
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-l", metavar="KEY=VALUE", help="Only jobs with this label (repeatable: all of them)."),
    ] = None,
    array: Annotated[str | None, typer.Option("--array", help="Only the jobs of this array (its id).")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Your jobs (every tenant's with an admin token), oldest first. On a narrow terminal the
    LOSS, STEP, CPU, NODE and TENANT columns are left out (in that order) so that REASON stays
    one line, cut with an ellipsis; -o json has every field, times as Unix seconds."""
    with errors_reported(), connect(admin=tenant is not None) as client:  # another tenant's: an admin's read
        jobs = client.jobs(phase=phase or None, queue=queue, tenant=tenant, labels=_labels(label or []), array=array)

    def render(rows: list[dict[str, Any]]) -> None:
        if not rows:  # an empty table's header alone read like a failure to load
            given = (("phase", phase), ("queue", queue), ("tenant", tenant), ("label", label), ("array", array))
            filters = [f for f, asked in given if asked]
            err_console.print(f"no jobs{' of that ' + ' and '.join(filters) if filters else ''}", markup=False)
            return
        list_table(
            ["ID", "NAME", "TENANT", "PHASE", "NODE", "CPU req/lim", "STEP", "LOSS", "AGE", "REASON"],
            [
                [
                    j["id"],
                    _name(j),
                    j["tenant"],
                    j["phase"],
                    _nodes(j),
                    _cpu(j),
                    j["step"] or "",
                    number(j["loss"]),
                    ago(j["submitted_at"]),
                    local_times(j["reason"]),
                ]
                for j in rows
            ],
            optional=LIST_OPTIONAL,
        )

    emit(jobs, output, render)


def _name(j: dict[str, Any]) -> str:
    """The job's name, with its index in its array (`sweep[3]`) for a job of one."""
    index = (j["spec"].get("array") or {}).get("index")
    return j["name"] if index is None else f"{j['name']}[{index}]"


def _rates(rates: list[dict[str, float | None]]) -> str:
    """The speed measured at each allocation the job has held (what learned curves use)."""
    parts = []
    for r in sorted(rates, key=lambda r: (r.get("gpus") or 0, r.get("replicas") or 0)):
        gpus, replicas = r.get("gpus") or 0, r.get("replicas") or 0
        where = f"{gpus:.0f} GPU" if gpus else f"{replicas:.0f} replica"
        plural = "s" if (gpus or replicas) != 1 else ""
        parts.append(f"{where}{plural}: {r.get('steps_per_s') or 0:.3g}")
    return "; ".join(parts)


def _ran(j: dict[str, Any]) -> str:
    """Seconds run, and the limit it is held to where it has one: its own `max_runtime_s` or
    its queue's, whichever is smaller."""
    ran = f"{j.get('run_s', 0.0):.0f}s"
    limit = j.get("time_limit_s")
    if limit is None:
        return ran
    whose = f"queue {j['spec'].get('queue')}'s" if j.get("time_limit_of") == "queue" else "its"
    return f"{ran} of {limit:g}s ({whose} max_runtime_s)"


def _cpu_used(j: dict[str, Any]) -> str:
    """CPU-seconds used, and for a job without GPUs the share of the guaranteed core-seconds it
    held (`attained_service`): Slurm's CPU efficiency (`seff`)."""
    used = float(j.get("cpu_used_s") or 0.0)
    out = f"{_core_s(used)} core-s"
    held = float(j.get("attained_service") or 0.0)
    if not (j["spec"].get("resources") or {}).get("gpus") and held > 0:
        out += f" ({100 * used / held:.0f} % of the {_core_s(held)} core-s held)"
    return out


def _core_s(x: float) -> str:
    """Whole core-seconds, or two significant digits under 10 (a short job's held 0.4 core-s
    read "47 % of the 0 core-s held")."""
    return f"{x:.0f}" if x >= 10 or x == 0 else f"{x:.2g}"


def _disk_limit(j: dict[str, Any]) -> int | None:
    limit = (j["spec"].get("resources") or {}).get("disk_mb")
    return int(limit) if isinstance(limit, int) else None


def _disk(j: dict[str, Any]) -> str:
    """What its run folders held at the newest check (an ended job: what it left, until it is
    deleted), against its `resources.disk_mb` — which bounds each replica's folder on its own:
    a job that may run as a gang (its sum over the replicas) gets no share of one replica's."""
    used, limit = j.get("disk_mb"), _disk_limit(j)
    out = "not measured yet" if used is None else f"{used:.1f} MiB"
    replicas = (j["spec"].get("resources") or {}).get("replicas") or {}
    gang = max(int(replicas.get("min") or 1), int(replicas.get("max") or 1)) > 1
    if limit is not None and gang:
        out += f" (limit {limit} MiB a replica)"
    elif limit is not None:
        out += f" (limit {limit} MiB{f', {100 * used / limit:.0f} %' if used is not None else ''})"
    return out


@app.command()
def get(job_id: JobId, output: OutputOpt = Output.table) -> None:
    """One job: phase and why, placement, restarts, progress, spec."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        job = client.job(job_id)
        progress = client.progress(job_id) if output == Output.table and not Phase(job.phase).terminal else None

    def render(j: dict[str, Any]) -> None:
        spec = j["spec"]
        rows = [
            ("id", j["id"]),
            ("name", j["name"]),
            ("tenant", j["tenant"]),
            ("phase", j["phase"]),
            ("reason", local_times(j["reason"])),
            ("command", " ".join(spec["command"])),
            ("submitted", stamp(j["submitted_at"])),
            ("started", stamp(j["started_at"])),
            ("finished", stamp(j["finished_at"])),
            ("nodes", _nodes(j)),
            ("cpu req/limit", _cpu(j)),
            ("attempt", j["attempt"]),
            ("restarts", f"{j['restarts']} of {spec['max_restarts']}"),
            ("ran", _ran(j)),
            ("cpu used", _cpu_used(j)),
            *([("disk", _disk(j))] if j.get("disk_mb") is not None or _disk_limit(j) is not None else []),
            *([("after", ", ".join(spec["after"]))] if spec.get("after") else []),
            *([("after any", ", ".join(spec["after_any"]))] if spec.get("after_any") else []),
            *([("array", _array_row(spec["array"]))] if spec.get("array") else []),
            ("step", j["step"]),
            ("loss", number(j["loss"])),
            ("exit code", j["exit_code"]),
            ("checkpoint", j["checkpoint"]),
        ]
        if progress is not None and progress.rates:
            rows.append(("measured steps/s", _rates(progress.rates)))
        if progress is not None and progress.noise_scale is not None:
            rows.append(("gradient noise scale", f"{progress.noise_scale:.4g} samples"))
        if progress is not None and progress.restart_lost_s:
            rows.append(("resize cost (s)", ", ".join(f"{x:.1f}" for x in progress.restart_lost_s)))
        table(["FIELD", "VALUE"], rows)

    emit(job, output, render)


@app.command()
def logs(
    job_id: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")] = False,
    tail: Annotated[
        int | None,
        typer.Option(
            "--tail", "-n", min=1, max=MAX_TAIL_LINES, help=f"Only the last N lines (1 to {MAX_TAIL_LINES}) first."
        ),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw", help="Write the log's bytes as they are, control sequences too (what a pipe always gets)."
        ),
    ] = False,
    replica: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=1023,
            help="Only this replica's log, of the newest attempt, on Ray (one log per replica). The local "
            "engine keeps one log per job, each line prefixed \\[rankK], and refuses this for a gang.",
        ),
    ] = None,
    all_replicas: Annotated[
        bool,
        typer.Option(
            "--all-replicas",
            help="Every replica's output of the newest attempt, each line prefixed \\[rankK] (on Ray, where "
            "the plain view is rank 0's; with -f the ranks' lines as they come); --tail N is then the last N "
            "lines of each replica. The local engine's log already is this view.",
        ),
    ] = False,
) -> None:
    """The job's output (stdout and stderr): all of it (its last 8 MiB), or the last --tail lines.
    On a terminal, control sequences other than colours are shown as escapes (--raw: as they are)."""
    keep = raw or not _on_terminal()
    show = (lambda s: s) if keep else shown_log
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        wrote = False
        if follow:
            chunks = client.follow_logs(job_id, tail=tail, raw=True, replica=replica, all_replicas=all_replicas)
            for chunk in chunks:
                sys.stdout.write(show(chunk))
                sys.stdout.flush()
                wrote = wrote or bool(chunk)
        else:
            text = client.logs(job_id, tail=tail, replica=replica, all_replicas=all_replicas)
            sys.stdout.write(show(text))
            wrote = bool(text)
        if not wrote:  # say why there is nothing, on stderr: a pipe still gets only the log
            job = client.job(job_id)
            err_console.print(f"no output: job {job.id} is {job.phase} — {local_times(job.reason)}", markup=False)


def _on_terminal() -> bool:
    return sys.stdout.isatty()


@app.command()
def cancel(
    job_ids: Annotated[list[str] | None, typer.Argument(help="The ids of the jobs to cancel, one or several.")] = None,
    array: Annotated[
        str | None, typer.Option("--array", help="Also every job of this array (its id) that has not ended.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel jobs: a queued one ends now, a running one checkpoints and exits. With several ids,
    each is cancelled in turn and one that fails (not found, already ended) does not stop the
    others; the exit code is then the first failure's. -o json prints one job for one id, else a
    list of the jobs cancelled."""
    job_ids = list(job_ids or [])
    if not job_ids and array is None:
        bad_input("JOB_IDS", "give the ids of the jobs to cancel, or --array ID")
    if len(job_ids) > MAX_IDS:
        bad_input("JOB_IDS", f"{len(job_ids)} ids; at most {MAX_IDS} in one call")
    done: list[Any] = []
    with errors_reported(), connect_for_job() as client:
        if array is not None:
            done += client.cancel_array(array)  # one request for the whole array
            if not done and not job_ids:
                raise CliError(f"array {job_ref(array)}: none of your jobs of it is still to end", EXIT_FAILURE)
        cancelled = {j.id for j in done}
        todo = [i for i in dict.fromkeys(job_ids) if i not in cancelled]  # an id given twice is cancelled once
        more, code, stop, todo = _each_id(todo, client.cancel)
        done += more

    def render(jobs: Any) -> None:
        for j in jobs if isinstance(jobs, list) else [jobs]:
            console.print(f"{j['id']}: {j['phase']} — {local_times(j['reason'])}", markup=False)

    one = array is None and len(job_ids) == 1  # -o json: one job for one id, else a list
    if done:
        emit(done[0] if one else done, output, render)
    _exit_after_each(code, stop, todo, "not cancelled" if not one else "")


@app.command()
def delete(
    job_ids: Annotated[list[str] | None, typer.Argument(help="The ids of the ended jobs to delete.")] = None,
    array: Annotated[
        str | None, typer.Option("--array", help="Also every job of this array (its id), once all of them ended.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Delete ended jobs now, as retention does after `job_retention_days`: each job's record,
    events and run folder (its log, files and the checkpoints kept there) are gone for good.
    Refused, deleting nothing of it, for a job that has not ended (cancel it first), for one job
    of an array (delete the array with --array), for a job another job starts after, or for one
    whose processes its node has not yet seen exit (a job sluice failed itself). With
    several ids, one that fails does not stop the others; the exit code is then the first
    failure's. -o json prints what each delete answered."""
    job_ids = list(job_ids or [])
    if not job_ids and array is None:
        bad_input("JOB_IDS", "give the ids of the jobs to delete, or --array ID")
    if len(job_ids) > MAX_IDS:
        bad_input("JOB_IDS", f"{len(job_ids)} ids; at most {MAX_IDS} in one call")
    done: list[Any] = []
    array_code = 0
    with errors_reported(), connect_for_job() as client:
        if array is not None:
            try:
                done.append(client.delete_array(array))
            except SluiceError as err:
                if isinstance(err, UnreachableError) or err.status == 401:
                    raise
                array_code = report(as_cli_error(err, missing=f"job array {job_ref(array)}"))
        # an id given twice is deleted once
        more, code, stop, todo = _each_id(list(dict.fromkeys(job_ids)), client.delete)
        done += more

    def render(answers: Any) -> None:
        answers = answers if isinstance(answers, list) else [answers]
        for d in answers:
            for job_id in d["deleted"]:
                console.print(f"{job_id}: deleted", markup=False)
        console.print(f"run folders removed: {sum(d['folders'] for d in answers)}", markup=False)

    one = array is None and len(job_ids) == 1  # -o json: one answer for one id, else a list
    if done:
        emit(done[0] if one else done, output, render)
    _exit_after_each(array_code or code, stop, todo, "not deleted" if not one else "")


def _each_id(ids: list[str], act: Callable[[str], Any]) -> tuple[list[Any], int, SluiceError | None, list[str]]:
    """`act` on each id in turn (`job cancel`, `job delete`): what it answered, and the first
    failure's exit code, each failure said as it comes (one failure does not stop the others).
    A lost server or a refused token is the same for every id: that error and the ids not
    reached are returned, to be said once after what was done (`_exit_after_each`)."""
    done: list[Any] = []
    code = 0
    for k, job_id in enumerate(ids):
        try:
            done.append(act(job_id))
        except SluiceError as err:
            if isinstance(err, UnreachableError) or err.status == 401:
                return done, code, err, ids[k:]
            failed = report(as_cli_error(err, missing=f"job {job_ref(job_id)}"))  # said, each one
            code = code or failed
    return done, code, None, []


def _exit_after_each(code: int, stop: SluiceError | None, todo: list[str], not_done: str) -> None:
    """Exit as `_each_id` ended: with the error that stopped it, naming the ids `not_done`
    (a label; empty for one id), or with the first failure's code."""
    if stop is not None:
        said = as_cli_error(stop)
        rest = f"; {not_done}: {', '.join(todo)}" if not_done else ""
        raise typer.Exit(report(CliError(f"{said}{rest}", said.code, said.problems)))
    if code:
        raise typer.Exit(code)


ReplicaOpt = Annotated[
    int | None, typer.Option("--replica", min=0, max=1023, help="A gang's replica (rank) whose folder; default 0.")
]


@app.command()
def files(
    job_id: JobId,
    path: Annotated[str, typer.Argument(help="A folder in the job's folder, e.g. work (default: its top).")] = "",
    replica: ReplicaOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """List a job's files: work/ (its HOME with isolation on; off, it keeps the plane's), TMPDIR
    (tmp/) and its checkpoints, as its newest attempt left them on the node it ran on. `sluice
    job download` fetches one."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        found = client.files(job_id, path, replica=replica)

    def render(f: dict[str, Any]) -> None:
        table(
            ["NAME", "SIZE", "MODIFIED"],
            [
                [
                    e["name"] + ("/" if e["kind"] == "folder" else ""),
                    "" if e["kind"] == "folder" else size_text(e["size"]),
                    stamp(e["modified"]),
                ]
                for e in f["entries"]
            ],
        )
        if f["cut"]:
            console.print(f"... and {f['cut']} more (at most 10,000 names are listed)", markup=False)

    emit(found, output, render)


@app.command()
def download(
    job_id: JobId,
    path: Annotated[str, typer.Argument(help="The file in the job's folder, e.g. work/model.pt.")],
    to: Annotated[
        Path | None,
        typer.Option("--to", help="Where to write it (default: its name in this folder); '-' for standard output."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a file already there.")] = False,
    replica: ReplicaOpt = None,
) -> None:
    """Fetch one of a job's files (what `sluice job files` lists: a model it saved in work/, a
    checkpoint). A file the job is still writing comes up to the size it had when asked; one it
    shrinks meanwhile is an error, and no file is kept."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        bad_input("PATH", "name a file, e.g. work/model.pt")
    dest = to if to is not None else Path(name)
    with errors_reported(missing=f"job {job_ref(job_id)} or its file {path!r}"), connect_for_job() as client:
        if str(dest) == "-":
            client.download(job_id, path, sys.stdout.buffer, replica=replica)
            return
        if dest.is_dir():
            dest = dest / name
        if dest.exists() and not force:
            raise CliError(f"{dest} exists; --force to overwrite it, or --to another file", EXIT_USAGE)
        part = dest.with_name(dest.name + ".part")
        try:
            # Made afresh, never through a link nor over a file (another user's link planted in
            # a shared folder would have the job's bytes written over the file it names).
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            raise CliError(
                f"{part} is there (another download's, or left over): remove it, or --to another file", EXIT_FAILURE
            ) from None
        except OSError as err:
            raise CliError(f"could not write {part}: {err.strerror or err}", EXIT_FAILURE) from None
        try:
            with os.fdopen(fd, "wb") as out:
                n = client.download(job_id, path, out, replica=replica)
            part.replace(dest)
        except OSError as err:
            raise CliError(f"could not write {dest}: {err.strerror or err}", EXIT_FAILURE) from None
        finally:
            part.unlink(missing_ok=True)  # ours: made above
    err_console.print(f"wrote {path} of job {job_id} to {dest} ({size_text(n)})", markup=False)


@app.command()
def suspend(job_id: JobId, output: OutputOpt = Output.table) -> None:
    """Suspend a job: it checkpoints, stops and gives its quota back until resumed."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        job = client.suspend(job_id)
    emit(job, output, lambda j: console.print(f"{j['id']}: {j['phase']} — {local_times(j['reason'])}", markup=False))


@app.command()
def resume(job_id: JobId, output: OutputOpt = Output.table) -> None:
    """Resume a suspended job: it is admitted again and starts from its checkpoint. Refused
    (exit 1, the job stays Suspended) while its tenant is no longer granted its queue."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        job = client.resume(job_id)
    emit(job, output, lambda j: console.print(f"{j['id']}: {j['phase']} — {local_times(j['reason'])}", markup=False))


@app.command()
def why(job_id: JobId, output: OutputOpt = Output.table) -> None:
    """Why the job is where it is: every phase change and decision, with time and reason."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        events = client.why(job_id)
        job = plain(client.job(job_id)) if output == Output.table else None

    def render(rows: list[dict[str, Any]]) -> None:
        t0 = rows[0]["time"] if rows else 0.0
        table(
            ["TIME", "+S", "KIND", "WHAT AND WHY"],
            [[when(e["time"]), f"{e['time'] - t0:.1f}", e["kind"], local_times(e["message"])] for e in rows],
            title=f"job {job_id}",
        )
        if job is not None:  # where it stands now, e.g. why it is still pending
            console.print(f"now: {job['phase']} — {local_times(job['reason'])}", markup=False)

    emit(events, output, render)


WATCH_LINE_EVERY_S = 10.0
"""Off a terminal (a pipe, a CI log), `job watch` writes a line when the phase changes and
otherwise at most one this often (s) while the step moves: a redrawn bar would show nothing
until the job ended, and a line every poll would flood the log."""


def _watched(client: Client, job_id: str, interval: float) -> Iterator[tuple[JobOut, ProgressOut | None]]:
    """The job and its newest progress record, every `interval` s, until (and with) its end."""
    p = None
    while True:
        job = client.job(job_id)
        p = client.progress(job_id) or p  # the server drops it when the job ends: keep the last
        yield job, p
        if Phase(job.phase).terminal:
            return
        time.sleep(interval)


def _watch_lines(client: Client, job_id: str, interval: float) -> JobOut:
    """A line per phase change, and one per WATCH_LINE_EVERY_S while the job moves, each
    flushed at once (a reader at the pipe's other end sees it then)."""
    said: tuple[str, int] | None = None
    last = -math.inf
    job = None
    for job, p in _watched(client, job_id, interval):
        step = p.step if p else job.step
        now = time.monotonic()
        if said is None or job.phase != said[0] or (step != said[1] and now - last >= WATCH_LINE_EVERY_S):
            total = f"/{p.total_steps}" if p and p.total_steps else ""
            rate = f"{p.throughput:.3g}" if p and p.throughput else "-"
            loss = number(p.loss if p else job.loss) or "-"
            print(f"{job.phase:<9} step {step}{total}  loss {loss}  {rate} steps/s", flush=True)
            said, last = (job.phase, step), now
    assert job is not None
    return job


def _watch(client: Client, job_id: str, interval: float) -> JobOut:
    """Redraw one progress line from the job and its progress record until the job ends."""
    if not console.is_terminal:
        return _watch_lines(client, job_id, interval)
    columns = (
        TextColumn("{task.fields[phase]:<9}"),
        BarColumn(),
        TextColumn("step {task.completed:.0f}{task.fields[of]}"),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[rate]} steps/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(job_id, total=None, phase="", of="", loss="-", rate="-")
        for job, p in _watched(client, job_id, interval):
            total = p.total_steps if p else None
            bar.update(
                task,
                completed=p.step if p else job.step,
                total=total,
                phase=job.phase,
                of=f"/{total}" if total else "",
                loss=number(p.loss if p else job.loss) or "-",
                rate=f"{p.throughput:.3g}" if p and p.throughput else "-",
            )
    return job


@app.command()
def watch(
    job_id: JobId,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between updates, 0.1 to 60.")] = 1.0,
) -> None:
    """Follow a job live: a progress bar with its phase, step (of the total, when the job
    states one), loss and steps/s, until it ends. Exits 0 if it succeeded, 1 otherwise. Off a
    terminal (a pipe, a CI log) it writes a line at each phase change and one every 10 s
    while the job moves."""
    in_range("--interval", interval, 0.1, 60)
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        job = _watch(client, job_id, interval)
    console.print(f"{job.id}: {job.phase} — {local_times(job.reason)}", markup=False)
    if job.phase != Phase.SUCCEEDED.value:
        raise typer.Exit(EXIT_FAILURE)


@app.command()
def plot(
    job_id: JobId,
    out: Annotated[
        Path, typer.Option("--out", "-O", dir_okay=False, help="Image to write; .png, .svg or .pdf by its suffix.")
    ],
) -> None:
    """Plot a job's loss, throughput (steps/s) and CPU (requested, limit, used) over time.
    Loss, throughput and CPU used come from its progress, which the server keeps while the
    job is live; the CPU it was given comes from its events, kept until the job is forgotten
    (job_retention_days after it ended)."""
    with errors_reported(missing=f"job {job_ref(job_id)}"), connect_for_job() as client:
        job = client.job(job_id)
        progress = client.progress(job_id)
        events = client.why(job_id)
    with errors_reported():
        try:
            plot_job(job, progress, events, out)
        except (OSError, ValueError) as err:
            raise CliError(f"cannot write {out}: {err}", EXIT_USAGE) from None
    console.print(f"wrote {out}", markup=False)
