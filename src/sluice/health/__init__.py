"""Node health: KPI features, normalizing-flow detector, thresholds, health states, evaluation."""
