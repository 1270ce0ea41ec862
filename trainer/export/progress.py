"""Progress of a long export phase: one line each time another tenth of its bytes is done."""

from __future__ import annotations

from typing import Callable

PREFIX = "export:"


def size(nbytes: float) -> str:
    """Bytes for people: MB below a gigabyte, GB above (decimal, as file listings count)."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


class Progress:
    """`export: verified 3/16 shards, 18.0 of 96.1 GB (18%)`, at most `lines` lines for any
    size of checkpoint, the last one at 100 %."""

    def __init__(self, verb: str, unit: str, items: int, total_bytes: int,
                 log: Callable[[str], None] = print, lines: int = 10):
        self.verb, self.unit, self.items, self.total = verb, unit, items, max(total_bytes, 1)
        self.log, self.lines = log, lines
        self.done_items, self.done_bytes, self._shown = 0, 0, 0

    def add(self, nbytes: int) -> None:
        """One more item of `nbytes` is done."""
        self.done_items += 1
        self.done_bytes += nbytes
        tenth = self.done_bytes * self.lines // self.total
        if tenth > self._shown or self.done_items == self.items:
            self._shown = tenth
            self.log(f"{PREFIX} {self.verb} {self.done_items}/{self.items} {self.unit}, "
                     f"{size(self.done_bytes)} of {size(self.total)} "
                     f"({100 * self.done_bytes // self.total}%)")
