"""Ray settings the tests' own clusters start with."""

from __future__ import annotations

FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
"""`_system_config` of a test cluster's head: Ray's GCS declares a node dead after this many
missed health checks, one a period (Ray's defaults, 5 checks 3 s apart, take ~13 s on this
machine; these ~3.4 s, measured on test_node_loss_requeues_its_jobs_elsewhere...). The tests
that lose a node wait for that declaration; what they check does not depend on how long it
takes, and a cluster a user starts keeps Ray's defaults (docs/ray.md)."""
