"""Entry point of the ``sglang.srt.plugins`` group (SGLang >= 0.5.11 calls it in every process)."""

from __future__ import annotations


def register() -> None:
    """Cheap when disabled: one environment read; the --dynspec-* flags are always offered."""
    from .config import is_enabled_cheap

    from . import cli_args

    cli_args.register_flags()
    if not is_enabled_cheap():
        return
    from .activation import activate

    activate()
