"""Benchmarks behind `selfplay bench`: they print measured medians and ratios (tests never time anything)."""
