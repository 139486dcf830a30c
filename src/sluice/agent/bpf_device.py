"""A cgroup v2 device program: which character devices the processes of one cgroup may open.

cgroup v2 has no `devices` controller; the kernel asks the eBPF programs of type
`BPF_PROG_TYPE_CGROUP_DEVICE` attached to a process's cgroup (and its ancestors) instead, and
refuses the open (EPERM) when one of them returns 0. That is how a job is kept off the GPUs
it was not given on a v2 host (agent/gpu_fence.py). The program is a few instructions built
here and loaded with the bpf(2) system call through ctypes: no compiler, no bcc, no libbpf.

Its lifetime is its cgroup's: once attached, the file descriptor is closed and the kernel
keeps the program until the cgroup is removed with the attempt. It is attached with
`BPF_F_ALLOW_MULTI`, beside whatever systemd or a container runtime attached above: every
program on the path must allow an access. That holds only where those above were attached with
`BPF_F_ALLOW_MULTI` too: below one attached with `BPF_F_ALLOW_OVERRIDE` the kernel would run
ours instead of it, and below one attached with neither it refuses ours, so no fence is made
there (check_ancestors).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence
from pathlib import Path

DenyRule = tuple[int, int | None]
"""(major, minor) of character devices to refuse; minor None refuses every minor."""

_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_QUERY = 16
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_DEVCG_DEV_CHAR = 2
_ATTR_SIZE = 128
_LOG_SIZE = 65536
MAX_RULES = 1024
"""A bound on one program's rules (two instructions each): a machine has at most a few
dozen GPUs, so more is a bug, not a configuration."""

# Instruction opcodes (linux/bpf.h, linux/bpf_common.h).
_LDX_W = 0x61  # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
_AND_K = 0x57  # BPF_ALU64 | BPF_AND | BPF_K
_MOV_K = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JNE_K = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_EXIT = 0x95  # BPF_JMP | BPF_EXIT


class BpfUnavailable(OSError):
    """The kernel refused to load or attach the program (no bpf(2), no privilege, an old kernel)."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def deny_program(rules: Sequence[DenyRule]) -> bytes:
    """The program's instructions: 0 (refuse) for a character device matching a rule, 1 for
    everything else. The context is `struct bpf_cgroup_dev_ctx {u32 access_type; u32 major;
    u32 minor;}`, the device type in the low 16 bits of access_type."""
    if len(rules) > MAX_RULES:
        raise ValueError(f"{len(rules)} device rules; at most {MAX_RULES}")
    head = [
        _insn(_LDX_W, dst=2, src=1, off=0),  # r2 = access_type
        _insn(_AND_K, dst=2, imm=0xFFFF),  # r2 = device type
        b"",  # if r2 != char goto allow (patched below)
        _insn(_LDX_W, dst=3, src=1, off=4),  # r3 = major
        _insn(_LDX_W, dst=4, src=1, off=8),  # r4 = minor
    ]
    body: list[tuple[int, int, int, int]] = []  # (opcode, register, imm, target: -1 deny, -2 next rule)
    for major, minor in rules:
        if minor is None:
            body.append((_JEQ_K, 3, major, -1))
        else:
            body.append((_JNE_K, 3, major, -2))
            body.append((_JEQ_K, 4, minor, -1))
    allow = len(head) + len(body)
    deny = allow + 2
    code = head
    for pc, (op, reg, imm, target) in enumerate(body, start=len(head)):
        to = deny if target == -1 else pc + 2
        code.append(_insn(op, dst=reg, off=to - pc - 1, imm=imm))
    code[2] = _insn(_JNE_K, dst=2, off=allow - 3, imm=_DEVCG_DEV_CHAR)
    code += [_insn(_MOV_K, dst=0, imm=1), _insn(_EXIT), _insn(_MOV_K, dst=0, imm=0), _insn(_EXIT)]
    return b"".join(code)


def _bpf(cmd: int, attr: bytes | ctypes.Array[ctypes.c_char]) -> int:
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise BpfUnavailable(0, f"no bpf(2) system call number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, _ATTR_SIZE) if isinstance(attr, bytes) else attr
    ret = int(libc.syscall(number, cmd, buf, _ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise BpfUnavailable(err, os.strerror(err))
    return ret


def _load(program: bytes, log_size: int) -> int:
    insns = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    verifier_log = ctypes.create_string_buffer(max(log_size, 1))
    attr = struct.pack(
        "<IIQQIIQII16sII",
        _BPF_PROG_TYPE_CGROUP_DEVICE,
        len(program) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1 if log_size else 0,  # log level
        log_size,
        ctypes.addressof(verifier_log) if log_size else 0,
        0,
        0,
        b"sluice_devices",
        0,
        0,
    )
    try:
        return _bpf(_BPF_PROG_LOAD, attr)
    except BpfUnavailable as err:
        said = verifier_log.value.decode(errors="replace").strip().splitlines()
        detail = f" (verifier: {said[-1]})" if said else ""
        raise BpfUnavailable(err.errno, f"could not load the device program: {err.strerror}{detail}") from None


def load(rules: Sequence[DenyRule]) -> int:
    """Load the program; returns its file descriptor (the caller closes it).

    Without a verifier log first: a log that does not fit its buffer fails the load itself
    (ENOSPC), and the log of a program of a few hundred rules did not fit 64 KiB (red team
    s21). Only a refused program is loaded again with the log, for the verifier's reason."""
    program = deny_program(rules)
    try:
        return _load(program, 0)
    except BpfUnavailable:
        return _load(program, _LOG_SIZE)


def _attach_flags(cgroup_dir: Path) -> tuple[int, int]:
    """(flags, number) of the device programs attached to `cgroup_dir` itself."""
    group = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        buf = ctypes.create_string_buffer(struct.pack("<IIIIQI", group, _BPF_CGROUP_DEVICE, 0, 0, 0, 0), _ATTR_SIZE)
        _bpf(_BPF_PROG_QUERY, buf)
        _, _, _, flags, _, count = struct.unpack_from("<IIIIQI", buf.raw)
        return flags, count
    finally:
        os.close(group)


def check_ancestors(cgroup_dir: Path) -> None:
    """Raise where a program attached above `cgroup_dir` without BPF_F_ALLOW_MULTI: the kernel
    then refuses ours (no override allowed), or runs ours *instead of* it (BPF_F_ALLOW_OVERRIDE),
    so that the job would be let open what the host's own device policy refuses (red team s21)."""
    for parent in cgroup_dir.parents:
        if not (parent / "cgroup.procs").exists():
            break
        flags, count = _attach_flags(parent)
        if count and not flags & _BPF_F_ALLOW_MULTI:
            how = "override" if flags & 1 else "exclusive"
            raise BpfUnavailable(
                errno.EPERM, f"{parent} has a device program attached without BPF_F_ALLOW_MULTI ({how})"
            )


def attach(cgroup_dir: Path, rules: Sequence[DenyRule]) -> None:
    """Refuse the matching devices to every process in `cgroup_dir` (a cgroup v2 directory)
    and its descendants, from now until the cgroup is removed."""
    check_ancestors(cgroup_dir)
    prog = load(rules)
    try:
        group = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _bpf(_BPF_PROG_ATTACH, struct.pack("<IIIII", group, prog, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI, 0))
        except BpfUnavailable as err:
            why = f"could not attach the device program to {cgroup_dir}: {err.strerror}"
            raise BpfUnavailable(err.errno, why) from None
        finally:
            os.close(group)
    finally:
        os.close(prog)


def unavailable(parent: Path | None = None) -> str | None:
    """Why device programs cannot be used here (None when one loads, and none attached above
    `parent`, the jobs' groups' parent, stands in the way): checked once at start, so a host
    that cannot fence says so at `sluice up`, not at every launch."""
    try:
        if parent is not None:
            check_ancestors(parent / "job")
        os.close(load([(0, 0)]))
    except BpfUnavailable as err:
        return str(err.strerror or err)
    return None
