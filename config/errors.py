"""The one error type of profile handling: shown as-is, on one line, with exit code 2."""


class ProfileError(ValueError):
    """A profile that must not reach synthesis; the message names the bad value."""
