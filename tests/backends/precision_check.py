"""What the bf16-trains tests of both backends compare: the update a few steps at lr 1e-6 make to
the weights the optimizer keeps (fp32 masters when the model computes in bf16), against fp32's."""

from __future__ import annotations

import torch

STEPS = 3
LR = ("actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.optim.lr_warmup_steps=0")


def flat_update(before: list[torch.Tensor], after: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([(a.float() - b.float()).flatten() for a, b in zip(after, before)])


def assert_update_matches_fp32(low: torch.Tensor, full: torch.Tensor) -> None:
    """Nearly every weight moves, and by about what fp32 moves it (Adam's first steps are ~lr per
    weight, so bf16's rounding of the forward changes few signs)."""
    changed = (low != 0).float().mean().item()
    assert changed >= 0.9, (
        f"only {changed:.2%} of the weights changed in bf16 (fp32: {(full != 0).float().mean():.2%})"
    )
    rel = ((low - full).norm() / full.norm()).item()
    assert rel < 0.3, f"the bf16 update differs from fp32's by {rel:.2f} of its norm"
