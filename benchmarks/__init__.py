"""Micro-benchmarks, run as modules (`python -m benchmarks.codec`); never timed in tests."""
