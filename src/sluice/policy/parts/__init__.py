"""Composable pieces policies are built from: ordering, placement, capacity accounting."""
