"""A small synthetic English corpus for local runs, made deterministically (no download).

The text has real structure (agreement, recurring entities, arithmetic facts) so a tiny model's
loss falls visibly within a few hundred steps, which makes faults and recoveries easy to see.
"""

from __future__ import annotations

import random

_NAMES = ["Ada", "Grace", "Linus", "Ken", "Barbara", "Edsger", "Donald", "Frances", "Alan", "Radia"]
_NOUNS = ["cluster", "node", "checkpoint", "gradient", "kernel", "tensor", "scheduler", "volume",
          "pod", "rank", "shard", "optimizer", "network", "queue", "buffer", "model"]
_ADJS = ["fast", "quiet", "stale", "healthy", "sharded", "durable", "idle", "busy", "warm", "new"]
_VERBS = ["restarts", "saves", "loads", "checks", "sends", "watches", "trains", "replaces"]
_PLACES = ["the rack", "the zone", "the region", "the file system", "host memory", "the queue"]


def _sentence(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return (f"{rng.choice(_NAMES)} {rng.choice(_VERBS)} the {rng.choice(_ADJS)} "
                f"{rng.choice(_NOUNS)} in {rng.choice(_PLACES)}.")
    if kind == 1:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"{a} plus {b} is {a + b}."
    if kind == 2:
        n = rng.choice(_NOUNS)
        return f"When the {n} fails, the {rng.choice(_NOUNS)} {rng.choice(_VERBS)} the {n}."
    count = rng.randrange(2, 9)
    return f"The job used {count} ranks and {count * 8} GPUs for {rng.choice(_NOUNS)}s."


def documents(count: int, seed: int = 0) -> list[str]:
    """`count` short documents of a few sentences each."""
    rng = random.Random(seed)
    return [" ".join(_sentence(rng) for _ in range(rng.randrange(3, 12))) for _ in range(count)]
