"""`should_stop()`: true once sluice asked the job to stop (SIGTERM), so it can save and exit.

The handler only sets a flag; the training loop checks it between batches — a checkpoint
written from inside a signal handler could catch the model half-updated.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_stop = threading.Event()
_installed = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    _stop.set()


def install_stop_handler() -> bool:
    """Install the SIGTERM handler (idempotent). Only the main thread may install handlers;
    elsewhere this returns False and `should_stop()` retries on its next call."""
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_term)
    _installed = True
    return True


def should_stop() -> bool:
    install_stop_handler()
    return _stop.is_set()


def request_stop() -> None:
    """Ask the loop to stop from inside the job (same effect as SIGTERM)."""
    _stop.set()
