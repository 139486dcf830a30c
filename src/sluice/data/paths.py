"""Turning dataset keys (paths inside a source) into cache paths that cannot escape the cache.

A key comes from a source listing, which a tenant controls. Without these checks a key such
as ``../../etc/cron.d/x`` or a symlink planted in the cache would let one tenant's dataset
read or overwrite files outside its cache directory.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

from sluice.data.errors import UnsafePath

MAX_KEY_LENGTH = 1024


def check_key(key: str) -> str:
    """Return `key` normalised (forward slashes, no leading ``./``) or raise UnsafePath."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise UnsafePath(f"key {key[:80]!r}: empty or longer than {MAX_KEY_LENGTH} characters")
    if "\x00" in key or "\\" in key:
        raise UnsafePath(f"key {key!r}: contains a NUL byte or a backslash")
    p = PurePosixPath(key)
    if p.is_absolute():
        raise UnsafePath(f"key {key!r}: absolute paths are not allowed inside a dataset")
    parts = [s for s in p.parts if s != "."]
    if not parts or any(s == ".." for s in parts):
        raise UnsafePath(f"key {key!r}: '..' would leave the dataset's directory")
    if any(s.startswith(".sluice") for s in parts):
        raise UnsafePath(f"key {key!r}: names starting with '.sluice' are reserved for the cache")
    return "/".join(parts)


def inside(root: str, key: str) -> str:
    """The absolute path of `key` under `root`, refusing anything that resolves outside it.

    Parents are resolved with realpath so a symlinked directory inside the cache is caught;
    the last component is opened with O_NOFOLLOW by the cache itself.
    """
    clean = check_key(key)
    real_root = os.path.realpath(root)
    path = os.path.join(real_root, clean)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != real_root and not parent.startswith(real_root + os.sep):
        raise UnsafePath(f"key {key!r}: resolves outside the cache directory {real_root}")
    if os.path.islink(path):
        raise UnsafePath(f"key {key!r}: is a symlink in the cache; refusing to follow it")
    return path
