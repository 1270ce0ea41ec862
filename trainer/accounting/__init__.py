"""Accounting: the append-only event log every rank and restart writes, and the goodput computed
from it."""
