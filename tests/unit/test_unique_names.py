"""No two public classes in sluice share a name, so a name in a traceback, a doc or a review
points at one thing (`NodeCache` once meant both a model event and the node's dataset cache)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict

import sluice

PENDING: dict[str, str] = {}
"""Known duplicates whose rename is in flight on another branch; remove each when it lands."""


def _public_classes() -> dict[str, set[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    for info in pkgutil.walk_packages(sluice.__path__, "sluice."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and not name.startswith("_"):
                where[name].add(module.__name__)
    return where


def test_every_module_imports_and_no_two_public_classes_share_a_name() -> None:
    where = _public_classes()
    assert len(where) > 100, "the walk found suspiciously few classes"
    shared = {name: sorted(mods) for name, mods in where.items() if len(mods) > 1 and name not in PENDING}
    assert not shared, f"public classes with the same name in different modules: {shared}"


def test_the_pending_list_only_names_real_duplicates() -> None:
    """An entry whose rename has landed must go, so the list cannot hide a new duplicate."""
    where = _public_classes()
    stale = [name for name in PENDING if len(where.get(name, ())) < 2]
    assert not stale, f"no longer duplicated, remove from PENDING: {stale}"
