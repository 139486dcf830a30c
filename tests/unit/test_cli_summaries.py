"""The command lists of `sluice --help` show one line per command, not a ragged paragraph."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from sluice.cli.main import app
from sluice.cli.summaries import LONG_SENTENCE, summary


def test_a_summary_is_the_first_sentence_on_one_line() -> None:
    doc = """Cancel jobs: a queued one ends now, a running one
    checkpoints and exits. With several ids, each is cancelled.

    More on the command's own page."""
    assert summary(doc) == "Cancel jobs: a queued one ends now, a running one checkpoints and exits."


def test_abbreviations_do_not_end_the_sentence() -> None:
    assert summary("Plot a metric (e.g. loss vs. steps) over time. Then more.") == (
        "Plot a metric (e.g. loss vs. steps) over time."
    )


def test_a_long_sentence_is_cut_at_a_clause_that_stands_alone() -> None:
    long = "What jobs held, used and ran, per tenant: " + "jobs by phase, " * 20 + "and disk."
    assert summary(long) == "What jobs held, used and ran, per tenant."
    short_clause = "Queues: " + "a long list, " * 20 + "and more."  # "Queues" alone says nothing
    assert summary(short_clause) == short_clause


def test_every_command_list_row_is_one_line_on_a_wide_terminal() -> None:
    """Before, `job delete`'s row broke after "record," and "good." (the docstring's own
    line breaks), whatever the terminal's width."""
    runner = CliRunner()
    for group in ([], ["job"], ["node"], ["tenant"], ["queue"], ["dataset"], ["sim"], ["bench"]):
        out = runner.invoke(app, [*group, "--help"], env={"COLUMNS": "250"}, terminal_width=250).output
        panel = out[out.index("Commands") :]
        rows = [line for line in panel.splitlines() if line.startswith("│")]
        assert rows, out
        for row in rows:
            name = row[1:].split()[0] if row[1:].split() else ""
            assert re.match(r"[a-z]", name), f"{group}: a continuation line in the list: {row!r}"
            assert len(row.rstrip("│ ")) < 2 + 12 + LONG_SENTENCE + 60, row
