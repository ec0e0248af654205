"""Benchmarks (not tests): python -m bench.NAME --json OUT."""
