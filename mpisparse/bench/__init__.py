"""Benchmarks run by ``mpisparse bench``."""
