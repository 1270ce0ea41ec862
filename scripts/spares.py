"""What K hot spares cost per hour, against the goodput they save at a node failure rate.

The model, per node count n (the training nodes; the spares wait beside them):
- training nodes fail at `failure_rate` per GPU-day, each failure idling the whole run;
- without a spare a failure idles the run for a node replacement (`REPLACEMENT_S`): detection
  and eviction, a new instance booting and joining, the image pull. With a spare it idles the
  run for the survivors' detection of the lost peer (the trainer's collective timeout) and the
  ft_launcher's in-job restart with the spare (measured, `scripts.recovery_estimate`);
- a failure finds no spare when K or more nodes are already being replaced: nodes in
  replacement are Poisson with mean `failures per hour x n x replacement time`;
- the restore and the steps since the newest snapshot are the same with or without a spare:
  they are left out of both.
Idle node-hours are priced at the node's hourly price, the price the spares are billed at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from config import Profile, contract
from config.contract import RecoveryMode
from config.training import TrainConfig
from scripts import recovery_estimate

# Llama 3 (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4): 419 unexpected
# interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs, 78 % of them
# confirmed or suspected hardware issues. Those take a node out; the rest a restart fixes.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_HARDWARE_SHARE = 0.78
PER_1K_GPU_DAYS = 1000
DEFAULT_FAILURE_RATE = (LLAMA3_INTERRUPTIONS * LLAMA3_HARDWARE_SHARE * PER_1K_GPU_DAYS
                        / (LLAMA3_DAYS * LLAMA3_GPUS))  # 0.369 per 1,000 GPU-days

# A lost node's replacement, on paper: Kubernetes marks the node unreachable after 40-50 s and
# evicts after the toleration; a new instance boots and joins in 5-10 min, then pulls the
# ~20 GB image in 5-10 min (the midpoints: docs/deploy.md, "When a node is lost").
NODE_SILENT_S = 50
BOOT_AND_JOIN_S = 450
IMAGE_PULL_S = 450
REPLACEMENT_S = NODE_SILENT_S + contract.NODE_LOSS_TOLERATION_S + BOOT_AND_JOIN_S + IMAGE_PULL_S

# On-Demand list prices per hour, us-east-1, USD, after AWS's June 2025 P4 and P5 reductions;
# yours differ (region, Savings Plans, reservations, Capacity Blocks): pass --node_price.
ON_DEMAND_USD_PER_HOUR = {
    "p5.48xlarge": 55.04,
    "p4de.24xlarge": 27.45,
    "g5.8xlarge": 2.448,
}
BREAK_EVEN_SEARCH_LIMIT = 100_000  # nodes; no cluster is larger


@dataclass(frozen=True)
class SparesColumn:
    """One node count."""

    nodes: int
    failures_per_day: float
    no_spare_probability: float  # a failure finds every spare in replacement
    idle_node_hours_per_day_without: float
    idle_node_hours_per_day_with: float

    def saved_per_hour(self, price: float) -> float:
        return (self.idle_node_hours_per_day_without - self.idle_node_hours_per_day_with) / 24 * price


@dataclass(frozen=True)
class SparesPlan:
    spares: int
    failure_rate: float  # per 1,000 GPU-days
    node_price: float  # USD per node-hour
    replacement_s: float
    with_spare_s: float
    break_even_nodes: Optional[int]
    columns: tuple[SparesColumn, ...]

    @property
    def cost_per_hour(self) -> float:
        return self.spares * self.node_price


def poisson_at_least(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    below = sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k))
    return max(0.0, 1.0 - below)


def with_spare_seconds(profile: Profile) -> float:
    """Survivors wait out a collective on the lost peer, then the launcher restarts the workers
    with the spare in the lost node's place."""
    train = TrainConfig.model_construct(**profile.trainer.model_dump(), mode=profile.recovery.mode)
    measured = recovery_estimate.MEASURED[RecoveryMode.FT_LAUNCHER].without_restore_s
    return train.collective_timeout("cuda") + measured


def column(nodes: int, gpus_per_node: int, spares: int, failure_rate: float, replacement_s: float,
           with_spare_s: float) -> SparesColumn:
    per_day = failure_rate / PER_1K_GPU_DAYS * gpus_per_node * nodes
    in_replacement = per_day / 86_400 * replacement_s  # nodes being replaced, on average
    p_none = poisson_at_least(spares, in_replacement)
    idle_with = p_none * replacement_s + (1 - p_none) * with_spare_s
    return SparesColumn(nodes, per_day, p_none, per_day * replacement_s / 3600 * nodes,
                        per_day * idle_with / 3600 * nodes)


def node_price(profile: Profile, price: Optional[float]) -> float:
    if price is not None:
        return price
    try:
        return ON_DEMAND_USD_PER_HOUR[profile.instance_type]
    except KeyError:
        raise ValueError(f"no price of {profile.instance_type} on record "
                         f"({', '.join(ON_DEMAND_USD_PER_HOUR)}): pass --node_price") from None


def make_spares_plan(profile: Profile, nodes: Sequence[int] = (), spares: Optional[int] = None,
                     failure_rate: float = DEFAULT_FAILURE_RATE,
                     price: Optional[float] = None) -> SparesPlan:
    """K = `spares`, else the profile's spare_nodes, else 1 (what one spare would do)."""
    k = spares if spares is not None else (profile.spare_nodes or 1)
    usd = node_price(profile, price)
    spare_s = with_spare_seconds(profile)
    make = lambda n: column(n, profile.gpus_per_node, k, failure_rate, REPLACEMENT_S, spare_s)  # noqa: E731
    columns = tuple(make(n) for n in (nodes or [profile.node_count]))
    even = None
    if spare_s < REPLACEMENT_S:
        even = next((n for n in range(1, BREAK_EVEN_SEARCH_LIMIT) if make(n).saved_per_hour(usd) >= k * usd), None)
    return SparesPlan(k, failure_rate, usd, REPLACEMENT_S, spare_s, even, columns)


def _usd(x: float) -> str:
    return f"{'-' if x < 0 else ''}${abs(x):,.2f}"


def report(plan: SparesPlan, label_width: int, column_width: int) -> list[str]:
    """The spares section of `nvrx-eks plan`: a header, one table."""
    k = plan.spares
    lines = [
        f"{k} hot spare{'s' if k > 1 else ''} at {_usd(plan.node_price)} a node-hour: "
        f"{_usd(plan.cost_per_hour)} per hour; a lost node idles the run "
        f"{plan.replacement_s / 60:.0f} min without a spare, {plan.with_spare_s:.0f} s with one",
        f"node failures: {plan.failure_rate:.3g} per 1,000 GPU-days (default: Llama 3's "
        f"{LLAMA3_INTERRUPTIONS} interruptions in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} GPUs, "
        f"{LLAMA3_HARDWARE_SHARE:.0%} hardware; --failure_rate)",
        ("spares pay for themselves from " + f"{plan.break_even_nodes:,} nodes" if plan.break_even_nodes
         else "spares never pay for themselves at this failure rate"),
        "",
    ]
    cols = plan.columns
    rows = [
        ("node failures per day", [f"{c.failures_per_day:.3g}" for c in cols]),
        ("  finding no spare free", [f"{c.no_spare_probability:.2%}" for c in cols]),
        ("idle node-hours per day, no spare", [f"{c.idle_node_hours_per_day_without:,.2f}" for c in cols]),
        (f"idle node-hours per day, {k} spare{'s' if k > 1 else ''}",
         [f"{c.idle_node_hours_per_day_with:,.2f}" for c in cols]),
        ("goodput saved per hour", [_usd(c.saved_per_hour(plan.node_price)) for c in cols]),
        ("spares cost per hour", [_usd(plan.cost_per_hour) for _ in cols]),
        ("net per hour", [_usd(c.saved_per_hour(plan.node_price) - plan.cost_per_hour) for c in cols]),
    ]
    head = " " * label_width + "".join(f"{f'{c.nodes:,} node' + ('s' if c.nodes > 1 else ''):>{column_width}}"
                                       for c in cols)
    body = [(f"{label:<{label_width}}" + "".join(f"{v:>{column_width}}" for v in values)).rstrip()
            for label, values in rows]
    return lines + [head] + body
