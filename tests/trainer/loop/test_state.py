"""Each part of the run saves and loads its own state; the meta keeps the checkpoint format."""

import json

import pytest
import torch

from trainer.loop.data import GlobalSampler
from trainer.loop.state import RngState, TrainState, load_state, save_state


class Counter:
    """A recovery layer's stateful client, as ft_launcher's is."""

    def __init__(self, n: int = 0):
        self.n = n

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def test_the_meta_holds_each_part_under_its_name_and_the_train_state_at_the_top():
    sampler = GlobalSampler(100, seed=3)
    sampler.next_batch(0, 2, 4)
    meta = save_state(TrainState(step=7, loss=1.5, global_batch=8), 7,
                      {"sampler": sampler, "rng": RngState(torch.device("cpu")),
                       "ft_client": Counter(4)})
    json.dumps(meta)  # a snapshot's header holds it
    assert {"step", "loss", "global_batch_size", "saved_at", "sampler", "rng",
            "ft_client"} == set(meta)
    assert (meta["step"], meta["loss"], meta["global_batch_size"]) == (7, 1.5, 8)
    assert meta["sampler"] == sampler.state_dict() and meta["ft_client"] == {"n": 4}


def test_a_resume_gives_every_part_back_what_it_saved():
    torch.manual_seed(11)
    sampler, rng, client = GlobalSampler(100, seed=3), RngState(torch.device("cpu")), Counter(4)
    sampler.next_batch(0, 2, 4)
    meta = json.loads(json.dumps(save_state(TrainState(step=7, loss=1.5, global_batch=8), 7,
                                            {"sampler": sampler, "rng": rng, "ft_client": client})))
    expected_draw, expected_batch = torch.rand(3), sampler.next_batch(0, 2, 4)

    torch.manual_seed(99)
    train, sampler2, client2 = TrainState(global_batch=2), GlobalSampler(100, seed=3), Counter()
    load_state(meta, train, required={"sampler": sampler2, "rng": rng},
               optional={"ft_client": client2})
    assert (train.step, train.loss, train.global_batch, client2.n) == (7, 1.5, 8, 4)
    assert torch.equal(torch.rand(3), expected_draw)
    assert sampler2.next_batch(0, 2, 4) == expected_batch


def test_a_layer_absent_from_the_checkpoint_keeps_its_state_but_a_required_part_may_not_be_absent():
    meta = save_state(TrainState(step=3), 3, {"sampler": GlobalSampler(10, seed=1),
                                               "rng": RngState(torch.device("cpu"))})
    client = Counter(5)
    load_state(meta, TrainState(), required={}, optional={"ft_client": client})
    assert client.n == 5
    del meta["sampler"]
    with pytest.raises(KeyError, match="sampler"):
        load_state(meta, TrainState(), required={"sampler": GlobalSampler(10, seed=1)},
                   optional={})
