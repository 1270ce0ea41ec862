"""FSDP2 sharding: one unit per decoder layer, fp32 master weights computing in the chosen dtype
(`trainer.loop.precision`); activation checkpointing and torch.compile per layer.

FSDP2 (`fully_shard`) runs on CUDA with NCCL and on CPU with gloo alike, so local runs use the
very code and checkpoint format of the cluster.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.distributed import DistEnv
from trainer.loop.precision import choose as choose_precision
from trainer.loop.weights import FULL_INIT_MAX_BYTES, initialize_weights


def _apply_layer_options(layer: torch.nn.Module, checkpointed: bool, compiled: bool) -> None:
    """Activation checkpointing, then torch.compile, on one decoder layer's forward.

    The layer's forward is replaced in place, not wrapped in another module, so parameter names
    (and with them checkpoints) are the same with and without either option. The FSDP hooks
    stay outside the compiled region, as in torchtitan (compile per block, then shard).
    """
    forward = layer.forward
    if checkpointed:
        from torch.utils.checkpoint import checkpoint

        def forward_checkpointed(*args, _inner=forward, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        forward = forward_checkpointed
    if compiled:
        forward = torch.compile(forward)
    layer.forward = forward


def checkpointed_layers(mode: str, layers: int) -> list[bool]:
    """Which decoder layers recompute their activations: none, every other one, or all."""
    if mode == "full":
        return [True] * layers
    if mode == "selective":
        return [i % 2 == 1 for i in range(layers)]
    return [False] * layers


def build_sharded_model(ref: str, seed: int, env: DistEnv, param_bytes: int, *,
                        compile: bool = False, activation_checkpointing: str = "none",
                        full_init_max_bytes: int = FULL_INIT_MAX_BYTES,
                        initialize: bool = True,
                        compute_dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """Shard the model over all ranks and put its local shards on the device.

    The model is built on the meta device and sharded first, then its local shards are
    allocated. With `initialize=False` the weights stay uninitialized, for a caller that
    restores them (a restart must not pay for a random init that the restore overwrites) or
    calls `initialize_weights` once it knows nothing is to be restored. The parameters stay
    fp32; FSDP casts each unit's gathered parameters to `compute_dtype` for the forward and
    backward passes and reduces gradients in fp32 (`compute_dtype` None: the automatic choice
    for the device).
    """
    from trainer.loop.model import build_model

    model = build_model(ref, seed, "meta")
    layers = list(model.model.layers)
    for layer, ckpt in zip(layers, checkpointed_layers(activation_checkpointing, len(layers))):
        _apply_layer_options(layer, ckpt, compile)
    if compute_dtype is None:
        compute_dtype = choose_precision("auto", env.device.type).dtype
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for i, layer in enumerate(layers):
        # The root's parameters (embedding, norm, output) are gathered again for the backward
        # pass right after the forward: keeping the last layer gathered saves one all-gather.
        fully_shard(layer, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=env.device)
    model.reset_buffers()  # RoPE's frequencies, uninitialized since the meta device
    if initialize:
        initialize_weights(model, ref, seed, param_bytes, full_init_max_bytes)
    return model.train()
