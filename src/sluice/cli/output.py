"""How the CLI prints: rich tables for people, `-o json` for programs, errors on stderr."""

from __future__ import annotations

import calendar
import json
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sluice.cli.client import EXIT_USAGE, CliError, cli_error
from sluice.client import SluiceError

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table (for people) or json (for programs).")]


def plain(data: Any) -> Any:
    """The client's models (and lists of them) as the JSON the server sent."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [plain(x) for x in data]
    return data


def emit(data: Any, output: Output, render: Callable[[Any], None]) -> None:
    """Print `data` (JSON values or client models) as JSON, or hand it to `render` as JSON values."""
    data = plain(data)
    if output == Output.json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        render(data)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` as a terminal may show it: every control character written out as an escape
    (`\\x1b`, `\\n`). Why: what the CLI prints comes from the server and is written by other
    people — a tenant's argv, dataset source, or a reason quoting them — and an ESC would have
    the reader's terminal run it (clear the screen, set the title, plant a hyperlink, write
    the clipboard); a newline would forge table rows. Idempotent: its output has none left."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


# In a log: colours (SGR: ESC [ digits ; m) and line layout (\n, \t, \r) pass; any other control
# character -- the ESC of a title, clipboard or hyperlink sequence, BEL, C1 -- does not.
_LOG_CONTROL = re.compile(r"\x1b\[[0-9;]{0,32}m|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def shown_log(text: str) -> str:
    """A job's log as the reader's terminal may show it: its colours and line breaks kept, every
    other control character written out as an escape. A log is the job's own output, and the
    admin (or a tenant sharing an account) reads other tenants' jobs' logs: a job could print
    the sequences that set the terminal's title, plant hyperlinks or write its clipboard (OSC 52)."""
    return _LOG_CONTROL.sub(lambda m: m.group() if len(m.group()) > 1 else repr(m.group())[1:-1], text)


def _cell(value: Any) -> Text:
    """A table cell: plain text (never Rich markup: `[/]` in a tenant's string would make the
    whole table fail to print), control characters shown as escapes."""
    return Text("" if value is None else shown(str(value)))


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A kubectl-like table. Every column but the last (free text: reasons, messages) keeps
    its full width — ids and names are copied by users and must never be cut; the last one
    wraps on a narrow terminal. Cells are plain text (`_cell`). A table whose columns do not
    fit the terminal even so is printed at the width it needs (the terminal wraps its lines):
    Rich would otherwise shrink columns below their minimum, to nothing, and drop them
    (`sluice net bench` lost its MTU and last columns at 80)."""
    t = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
    cells = [[_cell(v) for v in row] for row in rows]
    widths = []
    for i, name in enumerate(columns):
        if i < len(columns) - 1:
            width = max([len(name), *(r[i].cell_len for r in cells)])
            t.add_column(name, no_wrap=True, min_width=width)
        else:
            # Wide enough for its longest word (up to LAST_WORD_MAX): a word is cut only where
            # it could not fit anyway (`queue list` printed TENANTS `everyon` / `e`).
            words = [len(w) for r in cells for w in r[i].plain.split()]
            width = max(min(20, len(name)), min(LAST_WORD_MAX, max(words, default=0)))
            t.add_column(name, overflow="fold", min_width=width)
        widths.append(width)
    for row in cells:
        t.add_row(*row)
    if _row_width(widths) > console.width:
        t.width = _row_width(widths)  # Rich's own cap (the console's width), lifted for this table only
    console.print(t)


LAST_WORD_MAX = 40
"""A table's last column is at least as wide as its longest word, up to this many characters."""

REASON_MIN_WIDTH = 24
"""Narrowest a list's free-text last column may get before optional columns are dropped."""


def _row_width(widths: Sequence[int]) -> int:
    """Characters a SIMPLE_HEAD table without edge padding takes for columns of these widths:
    one space at each edge, and three between columns (padding, separator, padding)."""
    return 2 + sum(widths) + 3 * max(0, len(widths) - 1)


def list_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, optional: Sequence[str] = ()) -> None:
    """A list whose last column (a reason) stays one line per row at any terminal width.

    Why: folding a long reason into a column a few characters wide makes every row many lines
    tall and unreadable at 80 columns. Instead the `optional` columns are left out, in the
    order given, until the last column has REASON_MIN_WIDTH characters; then it is cut with
    an ellipsis. Ids and names are never cut; `-o json` always has every field. Cells are
    plain text (`_cell`)."""
    cells = [[_cell(v) for v in row] for row in rows]
    keep = list(range(len(columns)))
    width_of = {i: max([len(columns[i]), *(r[i].cell_len for r in cells)]) for i in keep}
    budget = console.width
    for name in optional:
        if _row_width([width_of[i] for i in keep[:-1]] + [REASON_MIN_WIDTH]) <= budget:
            break
        keep.remove(columns.index(name))
    fixed = _row_width([width_of[i] for i in keep[:-1]] + [0])
    last_width = max(len(columns[-1]), min(width_of[keep[-1]], budget - fixed))
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for i in keep[:-1]:
        t.add_column(columns[i], no_wrap=True, min_width=width_of[i])
    t.add_column(columns[-1], no_wrap=True, overflow="ellipsis", max_width=last_width)
    for row in cells:
        t.add_row(*(row[i] for i in keep))
    console.print(t)


def report(err: CliError) -> int:
    """Print the error (and each named field) and return its exit code. The words are the
    server's, which may quote other people's strings: printed as plain text (`shown`)."""
    err_console.print(Text.assemble(("error:", "bold red"), f" {shown(str(err))}"))
    for p in err.problems:
        err_console.print(f"  {shown(str(p.get('field', '?')))}: {shown(str(p.get('problem', '')))}", markup=False)
    return err.code


def fail(err: CliError) -> NoReturn:
    """Print the error (`report`) and exit with its code."""
    raise typer.Exit(report(err))


def bad_input(where: str, problem: str) -> NoReturn:
    """Refuse bad input: one line `error: WHERE: PROBLEM` on stderr, exit 2, before any work. Printed
    as plain text, as it quotes the input (`cpu:x:` or `[x]` would otherwise turn into emoji or markup)."""
    err_console.print(Text.assemble(("error:", "bold red"), f" {where}: {problem}"))
    raise typer.Exit(EXIT_USAGE)


def in_range(flag: str, value: float | None, lo: float, hi: float, *, above: bool = False) -> None:
    """A finite number from lo (excluded when `above`) to hi (math.inf: no upper bound), or
    `bad_input` naming the flag (None: not given); NaN and infinities read "must be a finite number"."""
    if value is None:
        return
    finite = isinstance(value, int) or math.isfinite(value)  # an int past float's range is finite, not an error
    low_ok = value > lo if above else value >= lo
    rule = f"above {as_typed(lo)}" if above else f"at least {as_typed(lo)}"
    top = "" if isinstance(hi, float) and math.isinf(hi) else f" and at most {as_typed(hi)}"
    if not finite:  # NaN compares false with every bound: say what is wrong with it
        bad_input(flag, f"must be a finite number ({rule}{top}), got {as_typed(value)}")
    if not (low_ok and value <= hi):
        bad_input(flag, f"must be a number {rule}{top}, got {as_typed(value)}")


def as_typed(x: float) -> str:
    """A bound or value as typed: whole numbers in full (100000, not 1e+05), others short."""
    if isinstance(x, int):
        return str(x) if abs(x) < 10**30 else f"{str(x)[:8]}... ({len(str(abs(x)))} digits)"
    if math.isfinite(x) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


def when(t: float | None) -> str:
    """Wall-clock time of day for recent times, the date too for older ones."""
    if t is None:
        return ""
    if t < 10**8:  # a virtual clock (simulator): seconds since its start
        return f"{t:.1f}s"
    fmt = "%H:%M:%S" if time.time() - t < 86400 else "%Y-%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


_UTC_INSTANT = re.compile(r"\b(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z\b")


def local_times(text: str | None) -> str:
    """A reason or message with each instant the server wrote in ISO-8601 UTC
    (`2026-11-23T12:01:05Z`) shown in local time, as `when` shows times; -o json keeps the text.
    Control characters are shown as escapes (`shown`): a reason can quote a tenant's argv."""
    if not text:
        return ""
    text = shown(text)

    def local(m: re.Match[str]) -> str:
        return when(calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")))

    return _UTC_INSTANT.sub(local, text)


def stamp(t: float | None, now: float | None = None) -> str:
    """A moment as a person reads it: local date and time, and how long ago, e.g.
    `2026-11-23 12:01:05 (3m ago)`. Virtual (simulator) clocks as `when` shows them."""
    if t is None:
        return ""
    if t < 10**8:
        return when(t)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ({ago(t, now)} ago)"


def ago(t: float | None, now: float | None = None) -> str:
    if t is None:
        return ""
    dt = max(0.0, (now or time.time()) - t)
    if dt < 90:
        return f"{dt:.0f}s"
    if dt < 5400:
        return f"{dt / 60:.0f}m"
    if dt < 172800:
        return f"{dt / 3600:.1f}h"
    return f"{dt / 86400:.0f}d"


def size_text(n: float | None) -> str:
    """Bytes for people: `512 B`, `1.5 MiB`, up to TiB; '' for none."""
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def number(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


_BARE_404 = {"", "not found"}
"""What the server says when no route matched (the name held a `/` or `..`, say): it names nothing."""


@contextmanager
def errors_reported(missing: str | None = None) -> Iterator[None]:
    """`with errors_reported():` turns a CliError or a client error into a printed message and its exit code.
    `missing` (e.g. "job 'j-1'") names what a bare 404 was about: `error: job 'j-1' not found`."""
    try:
        yield
    except CliError as err:
        fail(err)
    except SluiceError as err:
        fail(as_cli_error(err, missing))


def as_cli_error(err: SluiceError, missing: str | None = None) -> CliError:
    """`cli_error`, with a bare 404 named by `missing` (e.g. "job 'j-1'") as `errors_reported` does."""
    if missing is not None and err.status == 404 and err.detail.strip().lower() in _BARE_404:
        return CliError(f"{missing} not found")
    return cli_error(err)
