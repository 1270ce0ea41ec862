"""Resource sizing and environment for every instance type of the table, EFA or not."""

from __future__ import annotations

import math

import pytest

from config import INSTANCE_TYPES, instance_spec
from k8s.environment import OFI_NCCL_NET, network_env
from k8s.resources import gib_quantity, training_resources


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_whole_node_sizing(instance_type: str) -> None:
    spec = instance_spec(instance_type)
    res = training_resources(spec)
    requests, limits = res.requests(), res.limits()
    assert requests["nvidia.com/gpu"].value == limits["nvidia.com/gpu"].value == spec.gpus
    assert 0 < res.cpus < spec.vcpus
    assert 0 < res.memory_gib < spec.memory_gib
    if spec.efa_interfaces:
        assert requests["vpc.amazonaws.com/efa"].value == spec.efa_interfaces
        assert requests["hugepages-2Mi"].value == "5120Mi"
        assert res.memory_gib + 10 < spec.memory_gib  # huge pages of two pods are not allocatable
    else:
        assert "vpc.amazonaws.com/efa" not in requests and "hugepages-2Mi" not in requests


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_network_env_follows_efa_and_rdma(instance_type: str) -> None:
    spec = instance_spec(instance_type)
    env = network_env(spec)
    assert ("FI_PROVIDER" in env) == bool(spec.efa_interfaces)
    assert env.get("FI_EFA_USE_DEVICE_RDMA") == ("1" if spec.gpudirect_rdma else None)
    # NCCL_NET always names the network, so a missing aws-ofi-nccl fails at start-up.
    assert env["NCCL_NET"] == (OFI_NCCL_NET if spec.efa_interfaces else "Socket")


def test_gib_quantities() -> None:
    assert gib_quantity(64.0) == "64Gi"
    assert gib_quantity(16) == "16Gi"
    assert gib_quantity(0.5) == "512Mi"


def test_shm_holds_every_local_ranks_checkpoint_buffers() -> None:
    """The same rule the trainer applies at start-up: a staging shard plus 3 own and 2 replica
    snapshot slots per rank, for every GPU of the node, plus the profile's headroom."""
    from config import load_profile
    from k8s.resources import checkpoint_buffers_gib, shm_size_gib
    from config.presets import preset_parameters

    p5 = load_profile("p5")  # llama3.1-8b over 16 ranks, tiers memory,node,peer
    shard_gib = preset_parameters("llama3.1-8b") * 12 / 16 / 2**30
    assert checkpoint_buffers_gib(p5) == pytest.approx(6 * shard_gib, rel=1e-3)
    assert shm_size_gib(p5) == math.ceil(8 * 6 * shard_gib + p5.tiers.shm_size_gib)
