"""`python -m sluice.agent.enter [--strict] [--user UID:GID] FILE... -- COMMAND...`: join
cgroups, then (optionally) become another user, then become COMMAND.

Why a launcher: a fault's processes must be in the node's cgroups from their first
instruction, so that the children they fork (stress-ng's workers) are born there too.
Moving a pid after it started misses the children it already made. The launcher writes its
own pid into each cgroup.procs file and then execs the command (same pid, nothing in
between goes through a shell). A file it cannot write is reported on stderr and skipped:
the fault still runs, pinned to the node's cores, only without that cgroup's counters.

`--strict` makes a file it cannot write an error instead (exit 125, nothing run): a limit the
process must be under (a tenant's warm helper's memory jail). `--user UID:GID` drops to that
uid and gid (no supplementary groups, umask 077) after joining and before the exec: a helper
that ran as the tenant from its first instruction could be traced by the tenant's own jobs
(same uid) before the plane moved it into its jail, and made to fork outside it; started
this way it is in the jail before it is the tenant's.
"""

from __future__ import annotations

import os
import sys

USAGE = "usage: python -m sluice.agent.enter [--strict] [--user UID:GID] CGROUP_PROCS_FILE... -- COMMAND..."
FAILED_TO_JOIN = 125


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(USAGE, file=sys.stderr)
        return 2
    cut = argv.index("--")
    files, command = argv[:cut], argv[cut + 1 :]
    strict, user = False, None
    while files and files[0] in ("--strict", "--user"):
        if files[0] == "--strict":
            strict, files = True, files[1:]
            continue
        if len(files) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        uid, sep, gid = files[1].partition(":")
        if not (sep and uid.isdigit() and gid.isdigit()):
            print(f"sluice.agent.enter: --user {files[1]!r} is not UID:GID", file=sys.stderr)
            return 2
        user, files = (int(uid), int(gid)), files[2:]
    me = str(os.getpid())
    for f in files:
        try:
            with open(f, "w") as out:
                out.write(me)
        except OSError as err:
            print(f"sluice.agent.enter: could not join {f}: {err.strerror}", file=sys.stderr)
            if strict:
                return FAILED_TO_JOIN
    if user is not None:
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
        os.umask(0o077)
    os.execv(command[0], command)
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
