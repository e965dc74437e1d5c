"""Notes a built model carries: one line each on what shardsched set on it for training
(`models.hf.training_defaults`); profiles copy them into `Profile.extra["notes"]`
(`profile.layers.notes_extra`) and `train` says them on the console."""
from __future__ import annotations

from torch import nn

NOTES_ATTR = "shardsched_notes"
"""The attribute of a built model that holds its notes."""


def model_notes(model: nn.Module) -> tuple[str, ...]:
    return tuple(getattr(model, NOTES_ATTR, ()))
