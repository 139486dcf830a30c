"""What a test's `sluice` subprocess keeps of the test session's environment.

tests/conftest.py gives each test session (and each pytest-xdist worker) a cgroup root and a
tenant uid range of its own, and a job interpreter every tenant uid can run. A `sluice up` a
test starts must keep them: under the default root its nodes' groups and network-fence tables
outlived the session, and a plane on the default uid range is refused while another worker's
plane holds an overlapping one (agent/uid_ranges.py).
"""

from __future__ import annotations

import os

KEEP = ("SLUICE_JOB_PYTHON", "SLUICE_CGROUP_ROOT", "SLUICE_JOB_UID_MIN", "SLUICE_JOB_UID_MAX")


def clean_env(keep: tuple[str, ...] = KEEP, drop: tuple[str, ...] = ("SLUICE_",)) -> dict[str, str]:
    """This process's environment without the variables starting with `drop`, but for `keep`."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop) or k in keep}
