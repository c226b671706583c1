"""Entry point of the ``sglang.srt.plugins`` group (SGLang >= 0.5.11 calls it in every process)."""

from __future__ import annotations

import logging

from . import gate


def register() -> None:
    """Offer the --dynspec-* flags; install the wrappers only when dynspec is enabled.

    SGLang swallows exceptions raised by plugins.  When dynspec is enabled, any failure here
    (a missing dependency included) must stop the server instead of leaving it running
    without the wrappers, so it is re-raised as ActivationError (a SystemExit).
    """
    wanted = gate.wanted()
    try:
        from . import server_flags

        server_flags.register_flags()
    except Exception as e:
        if wanted:
            raise SystemExit(f"sglang-dynspec: cannot register --dynspec-* flags: {type(e).__name__}: {e}") from e
        logging.getLogger("sglang_dynspec").warning("sglang-dynspec: --dynspec-* flags unavailable: %s", e)
    if not wanted:
        return
    try:
        from .activation import activate

        activate()
    except SystemExit:
        raise
    except Exception as e:
        raise SystemExit(f"sglang-dynspec: activation failed: {type(e).__name__}: {e}") from e
