"""Reading a dataset's bytes from where they live: any fsspec URL (local path, s3://, http(s)://).

Every read is checked against the size the manifest promises, and retried with back-off, so
a connection that drops halfway delivers either the whole item or a clear SourceError —
never a short item that would then be cached as if it were whole.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Mapping
from typing import Any

import fsspec

from sluice.data.errors import SourceError, UnsafePath
from sluice.data.guard import SourceGuard
from sluice.data.manifest import MANIFEST_NAME, Manifest
from sluice.data.paths import check_key


def _split(url: str) -> tuple[str, str]:
    """(protocol, root path as fsspec wants it)."""
    if "://" not in url:
        return "file", os.path.abspath(url)
    proto, rest = url.split("://", 1)
    proto = proto.lower()
    if proto in ("file", "local"):
        return "file", os.path.abspath("/" + rest.lstrip("/")) if rest.startswith("/") else os.path.abspath(rest)
    if proto in ("http", "https"):
        return proto, url.rstrip("/")
    return proto, rest.rstrip("/")


class Source:
    """One dataset source. Thread-safe: fsspec's async filesystems serve many threads."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        retries: int = 3,
        backoff_s: float = 0.2,
        guard: SourceGuard | None = None,
    ) -> None:
        """With `guard` (what sluice fetches on a tenant's behalf: the plane, the node agents),
        the URL and options are checked now (SourceRefused) and the HTTP clients refuse
        forbidden addresses at connect time and on redirects; without it (a job reading its own
        data, tests), any URL is read."""
        self.url = url
        if guard is not None:
            guard.check(url, storage_options)
        self.protocol, self.root = _split(url)
        opts = dict(storage_options or {})
        if self.protocol in ("http", "https"):
            opts.setdefault("skip_instance_cache", True)
        if guard is not None:
            opts.update(guard.fsspec_options(self.protocol))
            opts["skip_instance_cache"] = True
        self.fs = fsspec.filesystem(self.protocol, **opts)
        self.retries = retries
        self.backoff_s = backoff_s

    def path_of(self, key: str) -> str:
        return posixpath.join(self.root, check_key(key))

    def _local_check(self, path: str) -> None:
        """A local source may hold a symlink pointing outside its root: refuse to read through it."""
        if self.protocol != "file":
            return
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise UnsafePath(f"{path}: resolves to {real}, outside the dataset source {real_root}")

    def list(self) -> Manifest:
        """The source's own manifest if it has one, else a recursive listing (sorted by key)."""
        own = posixpath.join(self.root, MANIFEST_NAME)
        try:
            if self.fs.exists(own):
                return Manifest.from_json(self.fs.cat_file(own))
        except (OSError, ValueError):
            pass
        try:
            found = self.fs.find(self.root, detail=True, withdirs=False)
        except (OSError, ValueError) as err:
            raise SourceError(f"cannot list {self.url}: {err}") from err
        items: list[tuple[str, int]] = []
        prefix = self.root.rstrip("/") + "/"
        for path, info in found.items():
            rel = path[len(prefix) :] if path.startswith(prefix) else posixpath.relpath(path, self.root)
            if rel == MANIFEST_NAME or rel.startswith(("_sluice_blocks/", ".")):
                continue
            key = check_key(rel)
            self._local_check(path)
            size = info.get("size")
            if size is None:
                size = self.fs.size(path)
            items.append((key, int(size)))
        items.sort()
        return Manifest(tuple(k for k, _ in items), tuple(s for _, s in items))

    def fetch(self, key: str, size: int | None = None, what: str = "") -> bytes:
        """The whole item, verified against `size`; retries, then SourceError naming the item."""
        path = self.path_of(key)
        self._local_check(path)
        return self._read(path, size, what or key)

    def fetch_raw(self, key: str, size: int | None = None) -> bytes:
        """Like fetch, for sluice's own objects (keys starting with _sluice, which check_key refuses)."""
        return self._read(posixpath.join(self.root, key), size, key)

    def _read(self, path: str, size: int | None, what: str) -> bytes:
        last: BaseException | None = None
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                data = self.fs.cat_file(path)
                if size is not None and len(data) != size:
                    raise SourceError(f"short read: got {len(data)} of {size} bytes")
                return bytes(data)
            except FileNotFoundError as err:
                raise SourceError(f"{what}: not found at {path} ({self.url})") from err
            except Exception as err:  # aiohttp/botocore errors surface as their own types
                last = err
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise SourceError(f"{what}: reading {path} from {self.url} failed after {self.retries + 1} attempts: {last}")

    def put(self, key: str, data: bytes) -> None:
        """Write an object next to the items (merged blocks, a manifest); for writable sources."""
        path = self.path_of(key) if not key.startswith("_sluice") else posixpath.join(self.root, key)
        parent = posixpath.dirname(path)
        if self.protocol == "file":
            os.makedirs(parent, exist_ok=True)
        self.fs.pipe_file(path, data)

    def exists(self, key: str) -> bool:
        try:
            return bool(self.fs.exists(posixpath.join(self.root, key)))
        except OSError:
            return False
