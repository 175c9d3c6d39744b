"""The actor update every train backend runs: epochs × mini-batches of the objective, one LR schedule.

Per step the learning rate comes from `lr_at`; per epoch the rows are shuffled (actor.shuffle)
by a generator seeded with the step, so a resumed run shuffles as the uninterrupted one did; per
mini-batch the backend accumulates the gradient of the objective over the micro-batches (their
weights make the sum the mini-batch's loss) and steps its optimizer. Metrics stay device tensors
until the mini-batch ends: one synchronisation with the device per mini-batch.

The backend supplies the parts that differ (`UpdateEngine`): its forward-backward over the
micro-batches (the torch backend loops over them, megatron runs its pipeline schedule) and its
optimizer step.

Non-finite updates are not applied: a backend's optimizer step skips gradients whose global norm
is inf/NaN (every rank sees the same all-reduced norm, so all skip together) and returns that
norm. The loop counts, per step, the mini-batch updates skipped that way (`train/nonfinite_grads`)
and those whose objective metrics were non-finite (`train/nonfinite_losses`); the trainer warns
and stops the run after trainer.max_consecutive_skipped_steps such steps in a row.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from dagrl.config.roles import TrainSettings
from dagrl.config.schema import OptimConfig
from dagrl.core.batch import Batch
from dagrl.core.metrics import fold, reduce
from dagrl.core.micro_batches import micro_batches
from dagrl.core.row_values import per_token
from dagrl.objectives import Objective


class UpdateEngine(Protocol):
    def set_lr(self, lr: float) -> None: ...

    def forward_backward(
        self, micro_batches: list[Batch], weights: list[float]
    ) -> list[dict[str, torch.Tensor]]:
        """Zero the gradients, then accumulate those of sum_i weights[i] × objective loss of
        micro-batch i. Returns the objective's metrics per micro-batch (none on ranks that
        compute no loss, e.g. pipeline stages before the last)."""
        ...

    def optimizer_step(self) -> torch.Tensor | float | None:
        """Clip and apply the gradients; the gradient norm before clipping (None if unknown here).
        Gradients whose norm is not finite are not applied (the norm is returned all the same)."""
        ...


NONFINITE_GRADS = "train/nonfinite_grads"  # updates skipped: gradient norm inf/NaN
NONFINITE_LOSSES = "train/nonfinite_losses"  # updates whose loss (objective metrics) was inf/NaN
NONFINITE_COUNTS = (NONFINITE_GRADS, NONFINITE_LOSSES)


def lr_at(optim: OptimConfig, step: int) -> float:
    """Learning rate of update `step` (0-based): linear warmup over optim.lr_warmup_steps, then
    constant. Adam's first steps are otherwise full-size on a still-random second moment."""
    return optim.lr * min(1.0, (step + 1) / max(1, optim.lr_warmup_steps))


def run_update(
    engine: UpdateEngine,
    objective: Objective,
    batch: Batch,
    settings: TrainSettings,
    seed: int,
    dp_size: int,
    step: int,
) -> dict[str, float]:
    """Epochs × mini-batches on this DP shard, as the trained role's spec says (`settings.update`:
    actor_rollout_ref.actor); returns the metrics (means over mini-batches)."""
    actor = settings.update
    assert actor is not None, "a forward-only role has no update"
    batch = per_token(batch)  # the driver may send per-row advantages (core/row_values.py)
    mini_rows = actor.ppo_mini_batch_size * settings.group_size // dp_size
    micro_rows = actor.ppo_micro_batch_size_per_gpu
    budget = actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None  # tokens per micro-batch
    lr = lr_at(actor.optim, step)
    engine.set_lr(lr)
    history: dict[str, list[float]] = {}
    counts = dict.fromkeys(NONFINITE_COUNTS, 0.0)  # summed over mini-batches, not averaged
    gen = torch.Generator().manual_seed(seed + step)
    for _ in range(actor.ppo_epochs):
        order = torch.randperm(len(batch), generator=gen) if actor.shuffle else torch.arange(len(batch))
        for mini in batch.index(order).chunks(mini_rows):
            for k, v in _update_mini_batch(engine, objective, mini, micro_rows, budget).items():
                if k in counts:
                    counts[k] += v
                else:
                    history.setdefault(k, []).append(v)
    metrics = {k: reduce(k, v) for k, v in history.items()}  # _max / _min keys keep the extreme
    metrics.update(counts)
    metrics["actor/lr"] = lr
    return metrics


def _update_mini_batch(
    engine: UpdateEngine, objective: Objective, mini: Batch, micro_rows: int, budget: int | None
) -> dict[str, float]:
    micros = micro_batches(mini, micro_rows, budget)
    weights = objective.micro_batch_weights(mini, micros)  # token or row shares: any micro-batch sizes
    outputs = engine.forward_backward(micros, weights)
    grad_norm = engine.optimizer_step()
    sums: dict[str, torch.Tensor | float] = {}
    for weight, metrics in zip(weights, outputs):
        fold(sums, metrics, weight)
    out = {k: float(v) for k, v in sums.items()}  # the mini-batch's one sync with the device
    out[NONFINITE_LOSSES] = float(not all(math.isfinite(v) for v in out.values()))
    if grad_norm is not None:
        out["actor/grad_norm"] = float(grad_norm)
        out[NONFINITE_GRADS] = float(not math.isfinite(out["actor/grad_norm"]))
    return out
