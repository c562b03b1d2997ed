"""Model descriptions used by the benchmarks."""
