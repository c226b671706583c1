"""End-to-end benchmark harness for sglang-dynspec: starts SGLang servers, drives load, compares modes."""

__all__ = ["__version__"]
__version__ = "0.1.0"
