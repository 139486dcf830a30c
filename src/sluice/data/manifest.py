"""A dataset's manifest: every item's key and size, in a fixed order.

Listing a remote source is slow (one request per directory, often one per file to learn its
size), so it is done once and the manifest is kept with the cache. The order is the item
index a torch sampler uses, and the unit that merged blocks are cut from.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from itertools import accumulate

from sluice.data.paths import check_key

MANIFEST_NAME = "_sluice_manifest.json"
"""A source may carry its own manifest under this name; it is then used instead of a listing."""


@dataclass(frozen=True)
class Manifest:
    keys: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.sizes):
            raise ValueError("manifest keys and sizes differ in length")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def offsets(self) -> list[int]:
        return [0, *accumulate(self.sizes)]

    def to_json(self) -> str:
        return json.dumps({"version": 1, "items": [[k, s] for k, s in zip(self.keys, self.sizes, strict=True)]})

    @staticmethod
    def from_json(text: str | bytes) -> Manifest:
        data = json.loads(text)
        items = data["items"] if isinstance(data, dict) else data
        keys = tuple(check_key(str(k)) for k, _ in items)
        sizes = tuple(int(s) for _, s in items)
        if any(s < 0 for s in sizes):
            raise ValueError("manifest has a negative size")
        return Manifest(keys, sizes)

    def save(self, path: str) -> None:
        """Write atomically, so a reader never sees half a manifest."""
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".sluice-manifest.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @staticmethod
    def load(path: str) -> Manifest:
        with open(path, "rb") as f:
            return Manifest.from_json(f.read())
