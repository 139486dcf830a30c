"""Checkpoints of a job: `save(state, step)`, `load()`, `due()`.

Files are `ckpt-<step>.pt` (torch.save of {"step", "state"}) in $SLUICE_CHECKPOINT_DIR — a
local folder or any fsspec URL (s3://...). A save is atomic: it is written under a temporary
name and renamed, so a job killed mid-save leaves the previous checkpoint intact and `load()`
never sees half a file. Only the newest $SLUICE_CHECKPOINT_KEEP are kept.

torch is imported inside save/load only: importing the SDK stays cheap.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import threading
import time
from pathlib import Path
from typing import Any

from sluice.sdk._env import context
from sluice.sdk._progress import MAX_STEP, append_record, whole_step

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{1,16})\.pt$")
"""A checkpoint's file name; more digits than 2**53 has are no step save() writes."""


def _step_of(name: str) -> int | None:
    m = _NAME.match(name)
    return None if m is None or int(m.group(1)) > MAX_STEP else int(m.group(1))


_last_save = time.monotonic()


def _is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://"))


def _list(location: str) -> list[tuple[int, str]]:
    """(step, path) of every finished checkpoint, oldest first."""
    if _is_url(location):
        import fsspec

        fs, root = fsspec.core.url_to_fs(location)
        try:
            names = [(p.rsplit("/", 1)[-1], p) for p in fs.ls(root, detail=False)]
        except FileNotFoundError:
            return []
        proto = location.split("://", 1)[0]
        found = [(step, f"{proto}://{p}") for n, p in names if (step := _step_of(n)) is not None]
    else:
        d = _local(location)
        if not d.is_dir():
            return []
        found = [(step, str(d / n)) for n in os.listdir(d) if (step := _step_of(n)) is not None]
    return sorted(found)


def _tmp_name(name: str) -> str:
    """Where a save writes before its rename: one per process and thread, so two threads saving
    the same step at once do not write one file (and the second rename find it gone)."""
    return f".tmp-{os.getpid()}-{threading.get_ident()}-{name}"


def save(state: dict[str, Any], step: int) -> str:
    """Write `state` (a dict) as the checkpoint of `step` (a whole number, 0 to 2**53, as
    `report` takes); returns its path and records it in progress.jsonl."""
    global _last_save
    # The step report() takes: a negative one wrote ckpt--00000000001.pt, never found by load()
    # nor rotated away; int() made 2.9, "7" and True steps 2, 7 and 1; past 2**53 the agent
    # drops the record, so the plane never learns of the checkpoint.
    step = whole_step(step, "sluice.sdk.checkpoint.save")
    if not isinstance(state, dict):
        # load() returns a dict or None: a tuple or a bare tensor was saved, then read back as
        # None, a fresh start, without a word.
        raise TypeError(
            f"sluice.sdk.checkpoint.save: state must be a dict (e.g. {{'model': model.state_dict()}}), "
            f"got {type(state).__name__}"
        )
    import torch

    ctx = context()
    location = ctx.checkpoint_dir
    name = f"ckpt-{step:012d}.pt"
    payload = {"step": step, "state": state, "saved_at": time.time()}
    if _is_url(location):
        import fsspec

        fs, root = fsspec.core.url_to_fs(location)
        fs.makedirs(root, exist_ok=True)
        final, tmp = f"{root}/{name}", f"{root}/{_tmp_name(name)}"
        with fs.open(tmp, "wb") as f:
            torch.save(payload, f)
        fs.mv(tmp, final)
        path = f"{location.split('://', 1)[0]}://{final}"
    else:
        d = _local(location)
        d.mkdir(parents=True, exist_ok=True)
        tmp_path = d / _tmp_name(name)
        with open(tmp_path, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_path, d / name)
        path = str(d / name)
    _rotate(location, ctx.checkpoint_keep)
    _last_save = time.monotonic()
    append_record({"t": time.time(), "step": step, "checkpoint": path})
    return path


def _rotate(location: str, keep: int) -> None:
    old = _list(location)[:-keep]
    if not old:
        return
    if _is_url(location):
        import fsspec

        fs, _ = fsspec.core.url_to_fs(location)
        for _, p in old:
            fs.rm(p)
    else:
        for _, p in old:
            Path(p).unlink(missing_ok=True)


def load(*, weights_only: bool = True) -> dict[str, Any] | None:
    """The newest readable checkpoint's state, or None when there is none (a fresh start).

    An unreadable newest file (disk trouble) is skipped with a warning in favour of the one
    before it, rather than failing the attempt. `weights_only=True` (torch's safe loader)
    accepts tensors, numbers, strings and containers of them — what state_dicts hold. A file it
    refuses for what it holds (a numpy array, say) raises RuntimeError naming the file when no
    older checkpoint loads either: it was skipped like a torn one, and since every checkpoint of
    the job holds the same kinds of things, the job started again from step 0 with only a
    warning in its log. A newest file the safe loader refuses while an older one loads is taken
    for a damaged one (a flipped byte in its pickle reads as an unknown name) and skipped.
    """
    import torch

    location = context().checkpoint_dir
    refusal: str | None = None
    for step, path in reversed(_list(location)):
        try:
            if _is_url(location):
                import fsspec

                with fsspec.open(path, "rb") as f:
                    payload = torch.load(f, map_location="cpu", weights_only=weights_only)
            else:
                payload = torch.load(path, map_location="cpu", weights_only=weights_only)
        except pickle.UnpicklingError as err:
            if weights_only and "Weights only load failed" in str(err) and refusal is None:
                refused = next((ln.strip() for ln in str(err).splitlines() if "WeightsUnpickler error" in ln), "")
                refusal = (
                    f"sluice.sdk.checkpoint.load: {path} (step {step}) holds something torch's safe loader "
                    f"refuses ({refused[:300] or 'see torch.load'}); save tensors, numbers, strings and "
                    "containers of them (e.g. torch.from_numpy(a), a.tolist()), or, for a file you trust, "
                    "call sdk.checkpoint.load(weights_only=False)"
                )
            log.warning("checkpoint %s (step %d) unreadable, trying an older one: %s", path, step, err)
            continue
        except Exception as err:  # a torn or foreign file must not stop a resume
            log.warning("checkpoint %s (step %d) unreadable, trying an older one: %s", path, step, err)
            continue
        state = payload.get("state") if isinstance(payload, dict) else None
        return state if isinstance(state, dict) else None
    if refusal is not None:
        raise RuntimeError(refusal)
    return None


def latest_step() -> int | None:
    """Step of the newest checkpoint, without loading it."""
    found = _list(context().checkpoint_dir)
    return found[-1][0] if found else None


def due() -> bool:
    """True when $SLUICE_CHECKPOINT_INTERVAL_S have passed since the last save (or the start)."""
    return time.monotonic() - _last_save >= context().checkpoint_interval_s
