"""Profiles, the instance table and the contract: the single source of truth for infra,
manifests and trainer."""

from config.contract import MODE_NAMES, RecoveryMode
from config.errors import ProfileError
from config.instances import INSTANCE_TYPES, InstanceSpec, instance_spec, network_interface_layout
from config.loading import available_profiles, load_profile, profile_from_dict
from config.profile import Profile

__all__ = [
    "INSTANCE_TYPES",
    "InstanceSpec",
    "MODE_NAMES",
    "Profile",
    "ProfileError",
    "RecoveryMode",
    "available_profiles",
    "instance_spec",
    "load_profile",
    "network_interface_layout",
    "profile_from_dict",
]
