"""Profiles and the instance table: the single source of truth for infra, manifests and trainer."""

from config.instances import INSTANCE_TYPES, InstanceSpec, instance_spec, network_interface_layout
from config.profile import (
    RECOVERY_MODES,
    Profile,
    ProfileError,
    available_profiles,
    load_profile,
    profile_from_dict,
)

__all__ = [
    "INSTANCE_TYPES",
    "InstanceSpec",
    "Profile",
    "ProfileError",
    "RECOVERY_MODES",
    "available_profiles",
    "instance_spec",
    "load_profile",
    "network_interface_layout",
    "profile_from_dict",
]
