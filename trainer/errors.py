"""The two kinds of error the recovery layers must tell apart from a fault, in a leaf module so
that any part of the trainer can raise them without importing the configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad setting; the message names the value and what is allowed."""

    # Settings are the same on every rank, so every rank raises the same message: rank 0 (or
    # the launcher it is handed to) says it once, not once per rank.
    same_on_every_rank = True


class FinalError(RuntimeError):
    """An error that no restart can fix (a full disk, a diverged loss): the job ends with exit
    code 2, which the local runner and the Job's pod failure policy never retry."""

    # True where the ranks decide it together (an all-reduced loss, an agreed restore), so
    # every rank raises the same message; False where one rank meets it (its own shard's write).
    same_on_every_rank = False
