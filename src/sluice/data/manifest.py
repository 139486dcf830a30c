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

from sluice.data.errors import SourceError
from sluice.data.paths import check_key

MANIFEST_NAME = "_sluice_manifest.json"
"""A source may carry its own manifest under this name; it is then used instead of a listing."""

MAX_MANIFEST_BYTES = 64 << 20
"""The most of a source's own manifest sluice reads (the plane reads it at `dataset create`, in
its own memory): a source's server decides how long the file is."""

MAX_ITEMS = 1 << 22
"""The most items a dataset may have (4,194,304; ImageNet-1k has 1.28 M): listings and manifests
are held in memory whole, by the plane and by every node's agent."""

MAX_ITEM_BYTES = 1 << 40
"""The largest size an item may claim (1 TiB). With MAX_ITEMS it bounds a dataset's total below
2**63, what the store's integer columns hold: a size is the source's word (a manifest, an HTTP
Content-Length), not a measurement."""


@dataclass(frozen=True)
class Manifest:
    keys: tuple[str, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.sizes):
            raise ValueError("manifest keys and sizes differ in length")
        if len(self.keys) > MAX_ITEMS:
            raise SourceError(f"the source has {len(self.keys)} items, more than the {MAX_ITEMS} a dataset may have")
        for key, size in zip(self.keys, self.sizes, strict=True):
            if not 0 <= size <= MAX_ITEM_BYTES:
                raise SourceError(
                    f"item {key[:200]!r} has size {size}: an item's size must be 0 to {MAX_ITEM_BYTES} bytes (1 TiB)"
                )

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
        if len(items) > MAX_ITEMS:
            raise SourceError(f"{MANIFEST_NAME} lists {len(items)} items, more than the {MAX_ITEMS} a dataset may have")
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
