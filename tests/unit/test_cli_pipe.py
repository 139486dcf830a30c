"""The CLI writing into a pipe whose reader has gone (`sluice ... | head`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [["sim", "run", "--help"], ["sim", "policies"]])
def test_a_closed_pipe_ends_the_command_quietly(args: list[str]) -> None:
    # `sluice sim run --help | head -40` printed `error: BrokenPipeError: [Errno 32] Broken pipe`.
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write is EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from sluice.cli.main import app; app()", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert "BrokenPipe" not in done.stderr and "error" not in done.stderr, done.stderr
