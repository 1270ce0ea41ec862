"""The one error type of synthesis: its message is shown as-is, on one line, with exit code 2."""


class SynthError(ValueError):
    """A missing or inconsistent input; the message names the key or value to fix."""

    exit_code = 2
