"""Deterministic fault injection: the published schedule and the real faults it fires."""
