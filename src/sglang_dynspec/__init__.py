"""sglang-dynspec: turn EAGLE / EAGLE-3 speculative decoding on or off per decode batch."""

__version__ = "0.1.0"
