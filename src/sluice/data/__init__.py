"""Datasets: fsspec sources, tiered node cache, small-file merging, prefetch, torch Dataset."""
