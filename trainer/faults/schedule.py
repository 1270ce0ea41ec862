"""The published example's fault schedule, reproduced exactly: a pure function of the seed, so
every rank and every restart sees the same steps, ranks and types."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Fault:
    step: int
    rank: int
    type: str


def schedule(seed: int, count: int, after_step: int, max_steps: int, world_size: int,
             types: Sequence[str], weights: Optional[Sequence[float]] = None) -> list[Fault]:
    """The published algorithm: sorted sampled steps, then per step a rank (never 0) and a type."""
    if count == 0:
        return []
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(after_step + 1, max_steps + 1), count))
    out = []
    for step in steps:
        rank = rng.randint(1, world_size - 1) if world_size > 1 else 0
        kind = rng.choices(list(types), weights=list(weights) if weights else None)[0]
        out.append(Fault(step, rank, kind))
    return out
