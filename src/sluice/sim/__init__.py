"""Simulated world: workload models, trace loaders, virtual clock, the sim engine."""
