"""Errors of the data path. Each one names the dataset, the item and what went wrong, because
a training job that dies with a bare `OSError` deep in a DataLoader worker is hard to act on."""

from __future__ import annotations


class DataError(Exception):
    """Base for everything the data path raises on purpose."""


class UnsafePath(DataError):
    """A dataset key that would leave its cache directory (``..``, absolute, or via a symlink)."""


class SourceError(DataError):
    """The dataset's source could not deliver an item intact, after the configured retries."""


class CorruptItem(DataError):
    """A cached item failed its size or checksum check; it has been dropped from the cache."""
