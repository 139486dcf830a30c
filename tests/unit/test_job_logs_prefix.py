"""Prefixing one replica's output with its rank, chunk by chunk (api/job_logs.LinePrefixer)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.api.job_logs import LONGEST_LINE, LinePrefixer


@given(st.binary(max_size=300), st.lists(st.integers(min_value=1, max_value=40), max_size=20))
def test_any_chunking_gives_the_same_prefixed_lines(data: bytes, cuts: list[int]) -> None:
    whole = LinePrefixer(b"[rank3] ")
    expected = whole.feed(data) + whole.flush()
    pieces, pos = LinePrefixer(b"[rank3] "), 0
    out = []
    for n in cuts:
        out.append(pieces.feed(data[pos : pos + n]))
        pos += n
    out.append(pieces.feed(data[pos:]))
    out.append(pieces.flush())
    assert b"".join(out) == expected
    lines = [line + b"\n" for line in expected[:-1].split(b"\n")] if expected else []
    assert all(line.startswith(b"[rank3] ") and line.endswith(b"\n") for line in lines)
    assert b"".join(line[len(b"[rank3] ") :] for line in lines).replace(b"\n", b"") == data.replace(b"\n", b"")


def test_a_line_that_never_ends_goes_out_in_bounded_pieces() -> None:
    p = LinePrefixer(b"[rank0] ")
    out = p.feed(b"x" * (LONGEST_LINE * 2 + 5))
    assert out == (b"[rank0] " + b"x" * LONGEST_LINE + b"\n") * 2
    assert p.flush() == b"[rank0] xxxxx\n"
    assert p.flush() == b""


def test_a_carriage_return_stays_inside_its_line() -> None:
    """A progress bar redraws with \\r: only \\n ends a line (as the shim's prefixing does)."""
    p = LinePrefixer(b"[rank1] ")
    assert p.feed(b"10%\r20%\r100%\ndone\n") == b"[rank1] 10%\r20%\r100%\n[rank1] done\n"
