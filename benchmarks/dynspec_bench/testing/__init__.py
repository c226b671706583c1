"""Test doubles: a tiny SGLang-like HTTP server for CPU-only runs of the harness."""
