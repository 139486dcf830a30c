"""Per-node mechanism: job processes in cgroups, live CPU limits, progress tailing, KPIs."""
