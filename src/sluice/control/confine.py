"""Where a job's checkpoints may go: its own run folder, or a storage root the admin configured.

`checkpoint.location` is a path a tenant typed, and the node agent creates the folder with the
control plane's permissions. Unchecked, `/etc` or `../../somewhere` makes folders wherever the
plane may write, and a location inside another tenant's run folder mixes their files. So:

- no location: `<checkpoint root>/<job id>/checkpoints` (the job's run folder), as before;
- a relative location: a folder strictly below the job's own run folder,
  `<checkpoint root>/<job id>/<location>`; `..` that would leave it, the run folder itself
  (`.`) and a first component the plane uses there (`attempt-<n>`, `job.log`, `work`:
  model/runfolder.py) are refused, since the folder is handed to the job's uid;
- an absolute path or file:// URL: must resolve (symlinks included) inside one of the admin's
  `checkpoint_roots`. It is stored resolved, but folders below the root may be the tenant's
  own, and a job can swap one for a symlink after submit: so whoever makes the folder (the node
  agent at launch, the plane for `--resume-from`) checks again that it is inside a root and
  walks down from that root without following a link (agent/isolation.py confined_dir);
- any other URL (s3://...): must lie under a URL root the admin listed, with no `..` segment.

Pure functions (realpath is the only filesystem access), called at submit so a bad location is a
422 naming `checkpoint.location`, and by the controller when it names the folder at launch.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

from sluice.model.runfolder import plane_name
from sluice.spec import SpecError
from sluice.spec.errors import FieldProblem

FIELD = "checkpoint.location"


def _refuse(problem: str) -> SpecError:
    return SpecError([FieldProblem(FIELD, problem)])


def _url_parts(url: str) -> tuple[str, list[str]]:
    scheme, rest = url.split("://", 1)
    return scheme.lower(), [p for p in rest.split("/") if p not in ("", ".")]


def _roots_text(roots: Sequence[str]) -> str:
    return ", ".join(roots) if roots else "none are configured"


def _below(location: str) -> str:
    """A relative location normalised, refusing one that would leave the run folder."""
    norm = posixpath.normpath(location)
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../"):
        raise _refuse(f"{location!r} leaves the job's run folder; relative locations stay inside it")
    return norm


def relative_inside(location: str) -> str:
    """A relative location normalised: a folder strictly below the job's run folder whose
    first component is none of the plane's own names there (the folder becomes the job's)."""
    norm = _below(location)
    if norm == ".":
        raise _refuse(
            f"{location!r} is the job's run folder itself, which is the plane's; give a folder below it (e.g. 'ckpt')"
        )
    first = norm.split("/", 1)[0]
    what = plane_name(first)
    if what is not None:
        raise _refuse(
            f"{location!r}: {first!r} in the job's run folder is {what}; checkpoints cannot go there "
            "(give another folder name, e.g. 'ckpt')"
        )
    return norm


def confine_checkpoint(location: str | None, roots: Sequence[str]) -> str | None:
    """The location to keep in the job's spec (canonical), or SpecError naming the field."""
    if location is None:
        return None
    if not location.strip() or "\x00" in location or "::" in location:
        raise _refuse("must be a path or one URL (no NUL byte, no chained '::' URL)")
    if "://" in location and not location.lower().startswith("file://"):
        scheme, parts = _url_parts(location)
        if ".." in parts:
            raise _refuse(f"{location!r}: '..' segments are not accepted in a URL location")
        for root in roots:
            if "://" not in root:
                continue
            rscheme, rparts = _url_parts(root)
            if rscheme == scheme and parts[: len(rparts)] == rparts:
                return f"{scheme}://{'/'.join(parts)}"
        raise _refuse(
            f"{location!r} is not under a storage root the admin configured (setting checkpoint_roots: "
            f"{_roots_text(roots)}); or give a path relative to the job's run folder"
        )
    path = location[len("file://") :] if location.lower().startswith("file://") else location
    if not os.path.isabs(path):
        return relative_inside(path)
    real = os.path.realpath(path)
    for root in roots:
        if "://" in root:
            continue
        rroot = os.path.realpath(root)
        if real == rroot or real.startswith(rroot.rstrip(os.sep) + os.sep):
            return real
    raise _refuse(
        f"{location!r} (resolves to {real}) is outside the storage roots the admin configured (setting "
        f"checkpoint_roots: {_roots_text(roots)}); give a path relative to the job's run folder instead"
    )


def checkpoint_base(location: str | None, checkpoint_root: str, roots: Sequence[str]) -> str:
    """The trusted folder a job's checkpoint folder (checkpoint_dir) is made below: the admin's
    root an absolute location lies in now, else the plane's checkpoint root. SpecError when an
    absolute location is in none of the roots (any more)."""
    if location is None or "://" in location or not os.path.isabs(location):
        return checkpoint_root
    inside = []
    for root in roots:
        if "://" in root:
            continue
        rroot = os.path.realpath(root).rstrip(os.sep) or os.sep
        if location == rroot or location.startswith(rroot.rstrip(os.sep) + os.sep):
            inside.append(rroot)
    if not inside:
        raise _refuse(
            f"{location!r} is outside the storage roots the admin configured (setting checkpoint_roots: "
            f"{_roots_text(roots)})"
        )
    return max(inside, key=len)


def checkpoint_dir(location: str | None, checkpoint_root: str, job_id: str) -> str:
    """The folder a job's checkpoints go to, from its (already confined) location."""
    root = checkpoint_root.rstrip("/")
    if location is None:
        return f"{root}/{job_id}/checkpoints"
    if "://" not in location and not os.path.isabs(location):
        # Checked by relative_inside at submit; a job stored before that check is refused by
        # the node agent at launch (it never hands a plane folder to a job), not here.
        return f"{root}/{job_id}/{_below(location)}"
    return f"{location.rstrip('/')}/{job_id}/checkpoints"
