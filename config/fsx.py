"""FSx for Lustre: the deployment types the stack creates, their sizes, and what they sustain.

The profile validates against this table, the storage construct synthesizes from it and the
capacity plan computes with it. Figures are AWS's, for SSD storage without EFA (checked December
2026); the plan counts baselines, never bursts:
- Sizes: CreateFileSystem, StorageCapacity, https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateFileSystem.html
  ("for SCRATCH_2, PERSISTENT_2, and PERSISTENT_1 deployment types using SSD storage type, the
  valid values are 1200 GiB, 2400 GiB, and increments of 2400 GiB").
- Throughput tiers: CreateFileSystemLustreConfiguration, PerUnitStorageThroughput (PERSISTENT_2
  SSD: 125, 250, 500, 1000 MB/s/TiB).
- Write and read throughput: "Performance characteristics of SSD and HDD storage classes",
  https://docs.aws.amazon.com/fsx/latest/LustreGuide/ssd-storage.html, and "How FSx for Lustre
  file systems work" (performance.html): a write, and a read that misses the servers' cache, run
  at the lower of the network and the disk throughput. SCRATCH_2: network 200 MB/s/TiB (burst
  1300), disks 200 read and 100 write. PERSISTENT-125/250/500/1000: network 320/640/1300/2600,
  disks at the tier (125 and 250 burst to 500).
- Metadata: "Managing metadata performance", https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-metadata-performance.html
  ("the number of provisioned Metadata IOPS determines the maximum rate of metadata operations"):
  PERSISTENT_2 created with a metadata configuration (Lustre 2.15) in Automatic mode gets
  Metadata IOPS by capacity; each Metadata IOPS sustains 2 file creates, opens or closes, 1 file
  delete, 0.1 directory creates or renames, or 0.2 directory deletes per second. AWS publishes
  no metadata rate for SCRATCH_2, nor one for stats, file renames, directory reads or fsyncs.
- One client: "Throughput to individual client instances" (performance.html): a client without
  EFA reads and writes at most 100 Gbps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

DeploymentType = Literal["SCRATCH_2", "PERSISTENT_2"]
PERSISTENT_2_TIERS: tuple[int, ...] = (125, 250, 500, 1000)  # MB/s per TiB
SMALLEST_GIB = 1200
STEP_GIB = 2400

# Baseline MB/s per TiB of capacity: (write, read). A tier's own figure for PERSISTENT_2.
SCRATCH_2_MB_S_PER_TIB = (100, 200)

# PERSISTENT_2's Metadata IOPS in Automatic mode, by capacity: (up to GiB, IOPS); beyond the
# last row, 12000 per 24000 GiB, up to the most any file system gets.
AUTOMATIC_METADATA_IOPS: tuple[tuple[int, int], ...] = ((1200, 1500), (2400, 3000), (9600, 6000),
                                                        (45600, 12000))
METADATA_IOPS_PER_24000_GIB = 12000
MAX_METADATA_IOPS = 192000
# Operations per second one Metadata IOPS sustains, by kind (AWS's table).
OPS_PER_METADATA_IOPS = {"create": 2.0, "open": 2.0, "close": 2.0, "unlink": 1.0, "mkdir": 0.1,
                         "rmdir": 0.2}
# What AWS's table leaves out, counted as the kind it resembles most (an assumption, said so
# wherever it is shown): a stat, a directory read and an fsync like an open; a file rename,
# which replaces one name by another, like a delete.
ASSUMED_LIKE = {"stat": "open", "listing": "open", "fsync": "open", "rename": "unlink"}
CLIENT_GB_S = 100 / 8  # one client without EFA: 100 Gbps
# "Sub-millisecond latencies for file operations" (performance.html): the bound the plan puts
# on one metadata call that waits for the one before it.
OPERATION_LATENCY_BOUND_S = 1e-3


def check_capacity(capacity_gib: int) -> int:
    if capacity_gib != SMALLEST_GIB and (capacity_gib <= 0 or capacity_gib % STEP_GIB):
        raise ValueError(f"fsx_capacity_gib {capacity_gib} is not a valid FSx for Lustre SSD size; "
                         f"use {SMALLEST_GIB} or a multiple of {STEP_GIB}")
    return capacity_gib


def capacity_at_least(gib: float) -> int:
    """The smallest valid capacity of at least `gib`."""
    if gib <= SMALLEST_GIB:
        return SMALLEST_GIB
    return STEP_GIB * math.ceil(gib / STEP_GIB)


def check_throughput(deployment_type: str, throughput: Optional[int]) -> Optional[int]:
    """PERSISTENT_2 needs a tier; SCRATCH_2 has a fixed one and takes none."""
    tiers = ", ".join(map(str, PERSISTENT_2_TIERS))
    if deployment_type == "PERSISTENT_2" and throughput not in PERSISTENT_2_TIERS:
        got = "is required" if throughput is None else f"{throughput} is not a tier"
        raise ValueError(f"throughput_mb_s_per_tib {got} with deployment_type PERSISTENT_2; "
                         f"use one of {tiers}")
    if deployment_type == "SCRATCH_2" and throughput is not None:
        raise ValueError(f"throughput_mb_s_per_tib {throughput} needs deployment_type "
                         f"PERSISTENT_2 (tiers {tiers}); SCRATCH_2 has a fixed throughput")
    return throughput


@dataclass(frozen=True)
class FileSystem:
    """One FSx for Lustre file system: its deployment type, capacity and throughput tier."""

    deployment_type: DeploymentType
    capacity_gib: int
    throughput_mb_s_per_tib: Optional[int] = None  # PERSISTENT_2 only

    def __post_init__(self) -> None:
        check_capacity(self.capacity_gib)
        check_throughput(self.deployment_type, self.throughput_mb_s_per_tib)

    @property
    def persistent(self) -> bool:
        return self.deployment_type == "PERSISTENT_2"

    @property
    def _per_tib(self) -> tuple[int, int]:
        tier = self.throughput_mb_s_per_tib
        return (tier, tier) if tier else SCRATCH_2_MB_S_PER_TIB

    @property
    def write_mb_s(self) -> float:
        return self.capacity_gib / 1024 * self._per_tib[0]

    @property
    def read_mb_s(self) -> float:
        return self.capacity_gib / 1024 * self._per_tib[1]

    @property
    def metadata_iops(self) -> Optional[int]:
        """Automatic mode's Metadata IOPS (PERSISTENT_2); None: AWS publishes none (SCRATCH_2)."""
        if not self.persistent:
            return None
        for up_to, iops in AUTOMATIC_METADATA_IOPS:
            if self.capacity_gib <= up_to:
                return iops
        return min(MAX_METADATA_IOPS, METADATA_IOPS_PER_24000_GIB * self.capacity_gib // 24000)

    def describe(self) -> str:
        tier = f" at {self.throughput_mb_s_per_tib} MB/s/TiB" if self.persistent else ""
        return f"{self.deployment_type}{tier}, {self.capacity_gib:,} GiB"
