"""Errors raised by sglang-dynspec."""


class ConfigError(ValueError):
    """Invalid configuration; the message names the field and where the value came from."""


class ActivationError(SystemExit):
    """The plugin could not put its wrappers in place.

    A SystemExit on purpose: SGLang's plugin loader logs and swallows ``Exception`` from
    plugins, which would leave a half-working server running.  This one is not swallowed,
    so the process (and with it the server start) fails with one clear message.
    """

    def __init__(self, message: str):
        super().__init__(f"sglang-dynspec: {message}")
        self.message = message
