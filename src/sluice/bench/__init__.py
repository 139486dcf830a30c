"""Benchmarks: scenarios run side by side, tables of ratios."""
