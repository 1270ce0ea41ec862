"""Operator tooling: the `nvrx-eks` kubectl wrapper (python -m scripts.nvrx_eks)."""
