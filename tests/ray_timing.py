"""Ray settings the tests' own clusters start with."""

from __future__ import annotations

FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
"""`_system_config` of a test cluster's head: Ray's GCS declares a node dead after this many
missed health checks, one a period. Ray's defaults (checks 3 s apart) took ~13 s on this
machine; these take ~5 s. The tests that lose a node wait for that declaration, and what they
check does not depend on how long it takes, except that a lost node's job must be seen to die
with its node (within 3 s), well before the declaration (test_ray_engine). A cluster a user
starts keeps Ray's defaults (docs/ray.md)."""
