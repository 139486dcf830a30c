"""`python -m sluice.agent.enter FILE... -- COMMAND...`: join cgroups, then become COMMAND.

Why a launcher: a fault's processes must be in the node's cgroups from their first
instruction, so that the children they fork (stress-ng's workers) are born there too.
Moving a pid after it started misses the children it already made. The launcher writes its
own pid into each cgroup.procs file and then execs the command (same pid, nothing in
between goes through a shell). A file it cannot write is reported on stderr and skipped:
the fault still runs, pinned to the node's cores, only without that cgroup's counters.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m sluice.agent.enter CGROUP_PROCS_FILE... -- COMMAND...", file=sys.stderr)
        return 2
    cut = argv.index("--")
    files, command = argv[:cut], argv[cut + 1 :]
    me = str(os.getpid())
    for f in files:
        try:
            with open(f, "w") as out:
                out.write(me)
        except OSError as err:
            print(f"sluice.agent.enter: could not join {f}: {err.strerror}", file=sys.stderr)
    os.execv(command[0], command)
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
