"""`should_stop()`: true once sluice asked the job to stop (SIGTERM), so it can save and exit.

The handler only sets a flag; the training loop checks it between batches — a checkpoint
written from inside a signal handler could catch the model half-updated.

A SIGTERM handler the job set before importing the SDK still runs, after the flag is set. One
set after it replaces the SDK's: `should_stop()` then stays false unless that handler calls
the one it replaced.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_stop = threading.Event()
_installed = False
_previous: Callable[[int, FrameType | None], Any] | None = None
"""The job's own SIGTERM handler, set before the SDK's: still called, after the flag is set."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    _stop.set()
    if _previous is not None:
        _previous(signum, frame)


def install_stop_handler() -> bool:
    """Install the SIGTERM handler (idempotent). Only the main thread may install handlers;
    elsewhere this returns False and `should_stop()` retries on its next call. A handler the
    job set before is kept: the SDK's calls it after setting its flag."""
    global _installed, _previous
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    before = signal.signal(signal.SIGTERM, _on_term)
    _previous = before if callable(before) and before is not _on_term else None
    _installed = True
    return True


def should_stop() -> bool:
    install_stop_handler()
    return _stop.is_set()


def request_stop() -> None:
    """Ask the loop to stop from inside the job (same effect as SIGTERM)."""
    _stop.set()
