"""The check an in-process attempt runs on the one before it (`trainer.leftovers`)."""

import torch

from trainer.leftovers import Attempt, start_clean


class _Cycle:
    """An object kept alive only by a reference cycle: a full collection frees it."""

    def __init__(self) -> None:
        self.me = self


def test_what_is_still_referenced_is_named_and_what_is_not_is_collected():
    model, optimizer = torch.nn.Linear(4, 4), _Cycle()
    attempt = Attempt()
    attempt.track(model=model, optimizer=optimizer, loop=None)
    kept = [model]  # e.g. a traceback or a hook that still holds the old model
    del model, optimizer
    assert attempt.alive() == ["model"]
    kept.clear()
    assert attempt.alive() == []


def test_a_cpu_attempt_starts_clean_without_device_figures():
    out = start_clean(Attempt(), torch.device("cpu"))
    assert out["alive"] == [] and out["device_memory"] is None and out["memory_before"] is None
