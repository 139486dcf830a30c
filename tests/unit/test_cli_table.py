"""`cli.output.table` on a terminal narrower than its columns: every column is still printed."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from sluice.cli import output
from sluice.net.report import COLUMNS


def _printed(monkeypatch: pytest.MonkeyPatch, width: int, columns: tuple[str, ...], row: list[str]) -> str:
    buf = io.StringIO()
    monkeypatch.setattr(output, "console", Console(file=buf, width=width, highlight=False, soft_wrap=True))
    output.table(columns, [row])
    return buf.getvalue()


@pytest.mark.parametrize("width", [80, 150, 300])
def test_a_table_wider_than_the_terminal_keeps_every_column_and_value(
    monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    # The `sluice net bench` table (12 columns, ~175 characters): at 80 columns Rich used to
    # shrink MTU and the last column to nothing and print neither header nor value.
    row = ["host", "1500", "24.7", "29.8", "0.367", "49.7", "75.3", "-", "-", "-", "40.4", "368"]
    out = _printed(monkeypatch, width, COLUMNS, row)
    header, values = out.splitlines()[1], out.splitlines()[3]
    assert all(name in header for name in COLUMNS), out
    assert values.split() == row, out


def test_a_table_that_fits_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _printed(monkeypatch, 80, ("NAME", "REASON"), ["node-0", "fine"])
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "node-0" in out and "fine" in out


def test_the_last_column_does_not_cut_a_word_it_has_room_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # `sluice queue list` at 80 columns printed its TENANTS cell `everyone` as `everyon` / `e`.
    columns = ("NAME", "COHORT", "WEIGHT", "NOMINAL", "LIMITS", "USAGE", "BORROWED", "ADMITTED", "PENDING", "TENANTS")
    row = ["research", "lab", "2", "cores=8 gpus=4", "borrow cores=4", "-", "-", "0", "0", "everyone"]
    out = _printed(monkeypatch, 80, columns, row)
    assert "everyone" in out.splitlines()[3], out
