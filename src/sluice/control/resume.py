"""Starting a new job from another job's checkpoint (`--resume-from ID`).

The checkpoints are copied, not shared: the new job writes its own checkpoints in its own
folder and the old job's stay as they were. Only `ckpt-<step>.pt` files are copied (the
SDK's finished checkpoints; a half-written temporary file never is), the newest last.
"""

from __future__ import annotations

import re

import fsspec

_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


def copy_checkpoints(src_dir: str, dst_dir: str, keep: int = 1) -> tuple[str, int] | None:
    """Copy the newest `keep` checkpoints of `src_dir` into `dst_dir`; the newest copy's path
    and step, or None when there is none. Local paths and fsspec URLs alike."""
    src_fs, src_root = fsspec.core.url_to_fs(src_dir)
    dst_fs, dst_root = fsspec.core.url_to_fs(dst_dir)
    if not src_fs.exists(src_root):
        return None
    found: list[tuple[int, str]] = []
    for path in src_fs.ls(src_root, detail=False):
        m = _CKPT.match(str(path).rstrip("/").rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), str(path)))
    if not found:
        return None
    found.sort()
    dst_fs.makedirs(dst_root, exist_ok=True)
    newest: tuple[str, int] | None = None
    for step, path in found[-keep:]:
        target = f"{dst_root.rstrip('/')}/ckpt-{step}.pt"
        with src_fs.open(path, "rb") as fin, dst_fs.open(target, "wb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
        newest = (target if "://" not in dst_dir else f"{dst_dir.rstrip('/')}/ckpt-{step}.pt", step)
    return newest
