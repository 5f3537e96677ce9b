"""Benchmarks: print figures, assert nothing. Run with ``make bench``."""
