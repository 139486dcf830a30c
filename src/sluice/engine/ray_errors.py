"""Ray's errors as one line for the plane's log.

A Ray error's text is written for a terminal: ANSI colour codes around the task's name, the
remote traceback, and the actor's details on lines of their own. Put into a log line as it is
(`the agent on w2 does not answer (...)`), it coloured server.log and broke one warning into a
dozen lines. The plane keeps what says what happened: the first line and, for a remote
exception, the exception's own line at the end of its traceback.
"""

from __future__ import annotations

import re

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
"""CSI sequences (colours, cursor moves), as Ray's errors carry them."""

BRIEF_MAX_CHARS = 300
"""The longest text `brief` gives; the rest is cut with an ellipsis."""


def brief(err: BaseException | str) -> str:
    """One line: `err`'s text without escape sequences, its first line, and the last line of
    a traceback in it (the remote exception) when there is one."""
    text = ANSI_ESCAPE.sub("", str(err))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(err).__name__ if isinstance(err, BaseException) else ""
    out = lines[0]
    if len(lines) > 1 and any(line.startswith("Traceback (most recent call last)") for line in lines):
        out = f"{out} ... {lines[-1]}"
    out = "".join(ch if ch.isprintable() else " " for ch in out)
    return out if len(out) <= BRIEF_MAX_CHARS else out[: BRIEF_MAX_CHARS - 1] + "…"
