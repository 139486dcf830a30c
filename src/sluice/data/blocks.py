"""Merged blocks: many small items packed into one object, read whole and sliced without copies.

Format: ``b"SLBK"`` · u32 item count · count × (u64 offset, u64 length) · payload. Offsets are
from the start of the block, so a reader that mmaps the block gets each item as a zero-copy
memoryview slice. A block holds a run of consecutive manifest indices, which keeps the layout a
pure function of (manifest, target size): every node and job cuts the same blocks.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass

MAGIC = b"SLBK"
_HEAD = struct.Struct("<4sI")
_ENTRY = struct.Struct("<QQ")


def pack(items: Sequence[bytes | memoryview]) -> bytes:
    head = _HEAD.size + _ENTRY.size * len(items)
    table = bytearray()
    off = head
    for it in items:
        table += _ENTRY.pack(off, len(it))
        off += len(it)
    return b"".join([_HEAD.pack(MAGIC, len(items)), bytes(table), *(bytes(i) for i in items)])


def unpack(block: bytes | memoryview) -> list[memoryview]:
    """Zero-copy views of the items in a block; raises ValueError on a malformed block."""
    mv = memoryview(block)
    if len(mv) < _HEAD.size:
        raise ValueError("block shorter than its header")
    magic, count = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ValueError("not a sluice block (bad magic)")
    out = []
    for i in range(count):
        off, n = _ENTRY.unpack_from(mv, _HEAD.size + i * _ENTRY.size)
        if off + n > len(mv):
            raise ValueError(f"block item {i} runs past the end of the block")
        out.append(mv[off : off + n])
    return out


def packed_size(sizes: Sequence[int]) -> int:
    return _HEAD.size + _ENTRY.size * len(sizes) + sum(sizes)


@dataclass(frozen=True)
class Layout:
    """Blocks as runs [starts[b], starts[b+1]) of manifest indices, cut at about `target` bytes."""

    target: int
    starts: tuple[int, ...]

    @staticmethod
    def cut(sizes: Sequence[int], target: int) -> Layout:
        starts = [0]
        acc = 0
        for i, s in enumerate(sizes):
            if acc > 0 and acc + s > target:
                starts.append(i)
                acc = 0
            acc += s
        starts.append(len(sizes))
        return Layout(target, tuple(starts))

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    def span(self, b: int) -> range:
        return range(self.starts[b], self.starts[b + 1])

    def block_of(self, i: int) -> int:
        import bisect

        return bisect.bisect_right(self.starts, i) - 1

    def key(self, b: int) -> str:
        return f"{self.target}/{b:06d}.blk"


def block_shuffle(layout: Layout, seed: int) -> list[int]:
    """An epoch order that shuffles blocks, then items within each block: random enough for SGD
    while every block is read once, whole."""
    rng = random.Random(seed)
    blocks = list(range(layout.count))
    rng.shuffle(blocks)
    order: list[int] = []
    for b in blocks:
        items = list(layout.span(b))
        rng.shuffle(items)
        order.extend(items)
    return order
