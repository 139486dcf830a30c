"""Incremental reading of a job's progress.jsonl.

The SDK appends one JSON line per report; the agent reads only what was appended since the
last poll (a byte offset and one `stat` per poll), so polling stays cheap however long a job
runs. A last line without its newline is still being written and is left for the next poll.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MAX_CHUNK = 4 * 1024 * 1024
"""Most bytes read per poll, so one runaway job cannot stall the loop for the others."""


class JsonlTail:
    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self) -> list[dict[str, Any]]:
        """Complete records appended since the last call; lines that are not JSON objects are skipped."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(min(size - self.offset, MAX_CHUNK))
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) == MAX_CHUNK:  # a line longer than a chunk is no record: skip past it
                self.offset += len(chunk)
            return []
        self.offset += end + 1
        out: list[dict[str, Any]] = []
        for line in chunk[:end].split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out
