"""Reading a dataset's bytes from where they live: any fsspec URL (local path, s3://, http(s)://).

Every read is checked against the size the manifest promises, and retried with back-off, so
a connection that drops halfway delivers either the whole item or a clear SourceError —
never a short item that would then be cached as if it were whole.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import time
from collections.abc import Callable, Mapping
from itertools import chain
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import fsspec
import fsspec.asyn
from fsspec.exceptions import FSTimeoutError

from sluice.data.errors import DataError, SourceError, UnsafePath
from sluice.data.guard import SourceGuard, normalized_options
from sluice.data.manifest import MANIFEST_NAME, MAX_ITEMS, MAX_MANIFEST_BYTES, Manifest
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


MAX_INDEX_PAGE_BYTES = 64 << 20
"""Most of an HTTP source's index page read to list it (fsspec's listing read it whole: a
server sending an endless page took the plane's memory)."""

MAX_INDEX_FOLDERS = 100_000
"""Most sub-folders of an HTTP source followed to list it (a server can link folders without end)."""

_LINK = re.compile(r"""<a\s+(?:[^>]*?\s+)?href=["']([^"']+)""", re.IGNORECASE)
_BARE_LINK = re.compile(r"https?://[-a-zA-Z0-9@:%_+.~#?&/=]+")
"""The links an index page holds (what fsspec's HTTP listing takes too): anchors' targets,
and bare absolute URLs in its text."""

LIST_TIMEOUT_S = 600.0
"""The most a listing of a remote source may take where no one chose (a node opening a dataset
for a job or a warm; the plane's `dataset create` takes settings dataset_list_timeout_s)."""

_DOT_STEP = frozenset({"..", "."})

_T = TypeVar("_T")


class ListingTimeout(SourceError):
    """Listing the source took longer than the deadline it was given."""


def _why(err: BaseException) -> str:
    """What a storage client's error says, with a hint where the fix is in the spec."""
    text = str(err) or type(err).__name__
    if type(err).__name__ == "NoCredentialsError":
        text += " (give storage_options key and secret, or anon: true for a public bucket)"
    return text


def _read_local(path: str, size: int | None) -> bytes:
    """A local item, read only if it is a regular file (opened non-blocking: a FIFO put in the
    source's place waited for a writer for ever, holding the warm or the job reading it) and,
    with a known `size`, only to one byte past it (a file that grew after the listing)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourceError(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        parts: list[bytes] = []
        got, limit = 0, None if size is None else size + 1
        while limit is None or got < limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit - got))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


async def _s3_read_bounded(fs: Any, path: str, size: int) -> bytes:
    """An S3 object read only to one byte past `size`. s3fs's `cat_file` reads the whole body:
    an endpoint (any public host a tenant names) that lists an item as 10 bytes and sends 300 MiB
    had them all read into the fetching process. As `cat_file` does, with s3fs's own error
    translation and retries, but the body is read piece by piece and dropped past the bound."""
    from s3fs.core import _error_wrapper, version_id_kw

    bucket, key, version = fs.split_path(path)

    async def call_and_read() -> bytes:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **version_id_kw(version))
        body = resp["Body"]
        parts: list[bytes] = []
        got = 0
        try:
            while got <= size:
                chunk = await body.read(min(1 << 20, size + 1 - got))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        finally:
            body.close()
        return b"".join(parts)

    return bytes(await _error_wrapper(call_and_read, retries=fs.retries))


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
        opts = normalized_options(url, storage_options)
        if self.protocol in ("http", "https"):
            opts.setdefault("skip_instance_cache", True)
        if guard is not None:
            opts.update(guard.fsspec_options(self.protocol))
            opts["skip_instance_cache"] = True
        try:
            self.fs = fsspec.filesystem(self.protocol, **opts)
        except (ImportError, TypeError, ValueError) as err:
            raise SourceError(f"cannot open {url}: {err}") from err
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

    def list(self, timeout_s: float | None = None) -> Manifest:
        """The source's own manifest if it has one, else a recursive listing (sorted by key).

        A source that does not exist, cannot be read or holds no files is a SourceError saying
        which: an empty listing is never taken for an empty dataset (fsspec lists a missing
        folder, bucket or prefix as empty). Whatever the storage client raises (no credentials,
        no route to the endpoint) is a SourceError too, naming the source.

        `timeout_s`: the most the whole listing may take (ListingTimeout past it): a remote
        source's server decides how slowly it answers and how many items it names, each of
        which may cost a request for its size. Every call to a remote store is given what is
        left (fsspec cancels it then); a local folder's listing is not timed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        own = posixpath.join(self.root, MANIFEST_NAME)
        try:
            if self._timed(deadline, timeout_s, self.fs.exists, own):
                return Manifest.from_json(self._read_manifest(own, deadline, timeout_s))
        except (OSError, ValueError):
            pass  # no readable manifest of its own: list the source
        except DataError:
            raise
        except Exception as err:  # botocore/aiohttp errors are their own types
            raise SourceError(f"cannot list {self.url}: {_why(err)}") from err
        try:
            if self.protocol in ("http", "https"):
                found = self._http_index(deadline, timeout_s)
            else:
                found = self._timed(deadline, timeout_s, self.fs.find, self.root, detail=True, withdirs=False)
        except DataError:
            raise
        except Exception as err:
            raise SourceError(f"cannot list {self.url}: {_why(err)}") from err
        items: list[tuple[str, int]] = []
        prefix = self.root.rstrip("/") + "/"
        for path, info in found.items():
            rel = path[len(prefix) :] if path.startswith(prefix) else posixpath.relpath(path, self.root)
            if rel == MANIFEST_NAME or rel.startswith(("_sluice_blocks/", ".")):
                continue
            key = check_key(rel)
            self._local_check(path)
            if self.protocol == "file" and info.get("type") not in (None, "file"):
                # a FIFO, socket or device: opening a FIFO waits for a writer, for ever
                raise SourceError(f"cannot list {self.url}: {key} is not a regular file")
            size = info.get("size")
            if size is None:
                try:
                    size = self._timed(deadline, timeout_s, self.fs.size, path)
                except DataError:
                    raise
                except Exception as err:  # a linked file that is not there (404), a refused request
                    raise SourceError(f"cannot list {self.url}: the size of {key}: {_why(err)}") from err
            if size is None:
                raise SourceError(f"cannot list {self.url}: its server gives no size for {key}")
            items.append((key, int(size)))
        if not items:
            self._explain_empty(deadline, timeout_s)
        items.sort()
        return Manifest(tuple(k for k, _ in items), tuple(s for _, s in items))

    def _timed(
        self, deadline: float | None, timeout_s: float | None, call: Callable[..., _T], *args: Any, **kw: Any
    ) -> _T:
        """`call` with what is left of the listing's time: fsspec's async stores (HTTP, S3)
        take it as `timeout` and cancel the request past it; ListingTimeout once none is left."""
        if deadline is None:
            return call(*args, **kw)
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._too_long(timeout_s)
        if getattr(self.fs, "async_impl", False):
            kw["timeout"] = left
        try:
            return call(*args, **kw)
        except FSTimeoutError:
            raise self._too_long(timeout_s) from None

    def _too_long(self, timeout_s: float | None) -> ListingTimeout:
        return ListingTimeout(
            f"listing {self.url} took longer than {timeout_s:g}s, the most sluice waits (setting "
            "dataset_list_timeout_s); give the source a _sluice_manifest.json listing its items and sizes"
        )

    def _read_bounded(self, path: str, limit: int, deadline: float | None, timeout_s: float | None) -> bytes | None:
        """`path` read a piece at a time, or None past `limit` bytes: whatever length the
        source's server claims or sends, the reader never holds more than that. The deadline
        is checked between pieces (each is bounded by the HTTP client's own timeout)."""
        parts: list[bytes] = []
        got = 0
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise self._too_long(timeout_s)
        try:
            # Over HTTP the request as a whole (headers and every read of the body) is given
            # what is left: one read of a page the server stops sending otherwise waited for
            # the server, past the deadline.
            with self._open_stream(path, timeout=left) as f:
                while True:
                    if deadline is not None and time.monotonic() > deadline:
                        raise self._too_long(timeout_s)
                    chunk = f.read(min(1 << 20, limit + 1 - got))
                    if not chunk:
                        return b"".join(parts)
                    parts.append(bytes(chunk))
                    got += len(chunk)
                    if got > limit:
                        return None
        except (FSTimeoutError, TimeoutError):
            if deadline is None or time.monotonic() < deadline - 0.1:  # another timeout: said as itself
                raise
            raise self._too_long(timeout_s) from None

    def _read_manifest(self, path: str, deadline: float | None = None, timeout_s: float | None = None) -> bytes:
        """The source's own manifest, refused (SourceError) past MAX_MANIFEST_BYTES."""
        data = self._read_bounded(path, MAX_MANIFEST_BYTES, deadline, timeout_s)
        if data is None:
            raise SourceError(
                f"{self.url}: {MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES >> 20} MiB, the most sluice "
                "reads; list fewer items in it (or leave it out and let sluice list the source)"
            )
        return data

    def _http_index(self, deadline: float | None, timeout_s: float | None) -> dict[str, dict[str, Any]]:
        """The files an HTTP source's index pages link to below it, its sub-folders' pages
        followed (as fsspec's HTTP listing finds them: its link patterns and rules), each page
        read to at most MAX_INDEX_PAGE_BYTES, at most MAX_ITEMS files and MAX_INDEX_FOLDERS
        folders. Sizes are left to a request per file, as fsspec leaves them."""
        found: dict[str, dict[str, Any]] = {}
        todo = [self.root + "/"]
        seen = set(todo)
        while todo:
            folder = todo.pop()
            for link in self._page_links(folder, deadline, timeout_s, top=folder == self.root + "/"):
                if not link.endswith("/"):
                    found[link] = {"name": link, "size": None}
                    if len(found) > MAX_ITEMS:
                        raise SourceError(f"{self.url} links more than {MAX_ITEMS} files, the most a dataset holds")
                elif link not in seen:
                    seen.add(link)
                    todo.append(link)
                    if len(seen) > MAX_INDEX_FOLDERS:
                        raise SourceError(
                            f"{self.url} links more than {MAX_INDEX_FOLDERS} folders, the most sluice follows; give "
                            f"the source a {MANIFEST_NAME} listing its items and sizes"
                        )
        return found

    def _page_links(self, folder: str, deadline: float | None, timeout_s: float | None, top: bool) -> tuple[str, ...]:
        """The links of one index page that point below it (files, and folders ending in /)."""
        try:
            page = self._read_bounded(folder, MAX_INDEX_PAGE_BYTES, deadline, timeout_s)
        except FileNotFoundError:
            if top:
                return ()  # said as "does not exist" by _explain_empty
            raise
        if page is None:
            raise SourceError(
                f"{self.url}: the index page {folder} is larger than {MAX_INDEX_PAGE_BYTES >> 20} MiB, the most sluice "
                f"reads; give the source a {MANIFEST_NAME} listing its items and sizes"
            )
        text = page.decode("utf-8", errors="ignore")
        parts = urlparse(folder)
        out: set[str] = set()
        most = MAX_ITEMS + MAX_INDEX_FOLDERS
        links = chain((m.group(0) for m in _BARE_LINK.finditer(text)), (m.group(1) for m in _LINK.finditer(text)))
        for link in links:
            if link.startswith("/") and len(link) > 1:
                link = f"{parts.scheme}://{parts.netloc}{link}"
            if not link.startswith("http"):
                link = folder + link.lstrip("/")
            below = link.replace("https", "http").startswith(folder.replace("https", "http")) and link != folder
            # A `..` or `.` step, plain or %-encoded, would lead out of the folder (or loop in it).
            # A query or fragment is no file: Apache's index pages link `?C=N;O=D` (sort by
            # name) and the like, and each was listed as an item that read back as the page.
            below = below and "?" not in link and "#" not in link
            if below and not _DOT_STEP.intersection(unquote(urlparse(link).path).split("/")):
                out.add(link)
                if len(out) > most:  # found one by one: a page of short links is not all held at once
                    raise SourceError(
                        f"{self.url}: the index page {folder} links more than {most} files and folders, the most a "
                        f"dataset's listing follows; give the source a {MANIFEST_NAME} listing its items and sizes"
                    )
        return tuple(sorted(out))

    def _explain_empty(self, deadline: float | None = None, timeout_s: float | None = None) -> None:
        """Raise the SourceError an empty listing stands for: no such source, an unreadable
        one, or one that holds no files. A remote store is asked within the listing's deadline."""
        if self.protocol == "file":
            try:
                os.listdir(self.root)
            except FileNotFoundError:
                raise SourceError(f"source {self.url} does not exist (no folder {self.root})") from None
            except NotADirectoryError:
                raise SourceError(f"source {self.url} is a file, not a folder") from None
            except OSError as err:
                raise SourceError(f"source {self.url} cannot be read: {err.strerror or err}") from None
        else:
            try:
                found = bool(self._timed(deadline, timeout_s, self.fs.exists, self.root))
            except DataError:
                raise
            except Exception as err:
                raise SourceError(f"cannot list {self.url}: {_why(err)}") from err
            if not found:
                raise SourceError(f"source {self.url} does not exist (nothing found there)")
        raise SourceError(f"source {self.url} holds no files")

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
                data = self._get(path, size)
                if size is not None and len(data) != size:
                    if len(data) < size:
                        raise SourceError(f"short read: got {len(data)} of {size} bytes")
                    raise SourceError(f"the source sent more than the {size} bytes the manifest gives the item")
                return bytes(data)
            except FileNotFoundError as err:
                raise SourceError(f"{what}: not found at {path} ({self.url})") from err
            except Exception as err:  # aiohttp/botocore errors surface as their own types
                last = err
            if attempt < self.retries:
                time.sleep(delay)
                delay *= 2
        raise SourceError(f"{what}: reading {path} from {self.url} failed after {self.retries + 1} attempts: {last}")

    def _open_stream(self, path: str, timeout: float | None = None) -> Any:
        """`path` opened for reading front to back. Over HTTP: one GET read as it arrives
        (block_size 0); the `size` given only spares fsspec the HEAD it would send to learn one,
        which a streamed read never uses; `timeout`: the most the whole GET may take (its
        headers and body), else the HTTP client's own."""
        if self.protocol in ("http", "https"):
            kw = {} if timeout is None else {"timeout": timeout}
            return self.fs.open(path, "rb", block_size=0, size=1, **kw)
        return self.fs.open(path, "rb")

    def _get(self, path: str, size: int | None) -> bytes:
        """The object at `path`. Over HTTP with a known `size` it is streamed and cut at one byte
        past `size` (which `_read` then refuses as a wrong size): a source's server decides how
        many bytes it sends, and reading them all would hold whatever it sent in memory."""
        if self.protocol == "file":
            return _read_local(path, size)
        if size is not None and self.protocol == "s3":
            return bytes(fsspec.asyn.sync(self.fs.loop, _s3_read_bounded, self.fs, path, size))
        if size is None or self.protocol not in ("http", "https"):
            return bytes(self.fs.cat_file(path))
        parts: list[bytes] = []
        got = 0
        with self._open_stream(path) as f:
            while got <= size:
                chunk = f.read(min(1 << 20, size + 1 - got))
                if not chunk:
                    break
                parts.append(bytes(chunk))
                got += len(chunk)
        return b"".join(parts)

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
