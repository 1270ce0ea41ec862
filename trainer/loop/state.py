"""What a resume needs besides the tensors, each part saving and loading its own state.

Every part of the run that has state implements `hooks.Stateful` (`state_dict`, `load_state_dict`),
as torchtitan's components do: where training stands (`TrainState`), the data sampler, the
random generators (`RngState`), and what a recovery layer adds (ft_launcher's client, through
`Hooks.stateful`). `save_state` gathers them into a checkpoint's meta, `load_state` hands each
part its own entry back; the tiers persist the meta with the tensors and never look inside.
The model's and optimizer's tensors are saved as flat local shards (`durable.state`), and the
learning rate is a function of the step (`train.lr_at`): neither needs an entry here.

The meta is JSON (a snapshot's header holds it). Its format: `TrainState`'s keys at the top
level, each other part under its own name.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Mapping

import torch

from trainer.hooks import Stateful


@dataclass
class TrainState:
    """Where training stands: the last step done, its loss (on a GPU the newest on the host,
    one step older than the state) and the global batch the optimizer saw."""

    step: int = 0
    loss: float = 0.0
    global_batch: int = 0

    def state_dict(self) -> dict:
        return {"step": self.step, "loss": self.loss, "global_batch_size": self.global_batch,
                "saved_at": time.time()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.loss = int(state["step"]), float(state.get("loss", 0.0))
        self.global_batch = int(state.get("global_batch_size") or self.global_batch)


class RngState:
    """The process's generators (torch's, and the device's on a GPU), as base64 text."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> dict:
        state = {"torch": _encode(torch.get_rng_state())}
        if self.device.type == "cuda":
            state["cuda"] = _encode(torch.cuda.get_rng_state(self.device))
        return state

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(_decode(state["torch"]))
        if self.device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state(_decode(state["cuda"]), self.device)


def _encode(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def save_state(train: TrainState, at_step: int, parts: Mapping[str, Stateful]) -> dict:
    """The meta of a checkpoint of step `at_step`: `train` at the top level, each part under
    its name."""
    return {**train.state_dict(), "step": at_step,
            **{name: part.state_dict() for name, part in parts.items()}}


def load_state(meta: dict, train: TrainState, required: Mapping[str, Stateful],
               optional: Mapping[str, Stateful]) -> None:
    """Hand each part its entry of `meta`. A required part's missing entry is an error (a
    resume without its data position or generators would silently train differently); an
    optional part (a recovery layer's, absent from a checkpoint of another mode) keeps its
    state."""
    train.load_state_dict(meta)
    for name, part in required.items():
        part.load_state_dict(meta[name])
    for name, part in optional.items():
        if name in meta:
            part.load_state_dict(meta[name])
