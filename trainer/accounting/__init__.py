"""Accounting: the event log every rank, launcher and restart writes (one file per node), and
the goodput computed from it in one pass."""
