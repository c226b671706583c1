"""Fake `sglang` package for CPU test runs only: put benchmarks/dynspec_bench/testing/shim first on PYTHONPATH."""
__version__ = "0.0.fake"
