"""PPO's value model: `critic.*` (verl's names and meanings). Part of the typed schema; import the
types from dagrl.config.schema.

The critic runs exactly when the advantage estimator needs values (`algorithm.adv_estimator=gae`,
`algorithm=ppo`); any key here set while it does not run is refused (config/validate_critic.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dagrl.algos.losses import LossAggMode
from dagrl.config.actor_schema import MegatronConfig, OptimConfig
from dagrl.config.enums import ModelDtype
from dagrl.config.ranges import ranged


@dataclass
class CriticModelConfig:
    path: Optional[str] = None
    """HF model directory of the value model's trunk; None = the actor's model
    (actor_rollout_ref.model.path). A scalar value head is put on its last hidden state."""
    dtype: Optional[ModelDtype] = None
    """Weights dtype; None = actor_rollout_ref.model.dtype."""
    gradient_checkpointing: bool = False
    """Recompute the trunk's activations in the critic's backward (verl's
    critic.model.enable_gradient_checkpointing): less memory, more time."""


@dataclass
class CriticConfig:
    strategy: str = "torch"
    """Train backend of the critic: torch (HF trunk, DDP) or megatron (critic.megatron.*); either
    trains beside either actor backend."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model: its trunk and dtype."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """critic.strategy=megatron: the value model's parallel layout, dtype, optimizer and offload,
    with the meanings of actor_rollout_ref.actor.megatron.* (verl's critic.megatron.*)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW of the critic; lr None = the actor's learning rate."""
    ppo_mini_batch_size: Optional[int] = ranged(None, ge=1, hint="or null = the actor's")
    """Prompts per critic optimizer step (× rollout.n responses); None = actor.ppo_mini_batch_size."""
    ppo_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Responses per critic forward/backward on each device."""
    forward_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Responses per forward of the values pass (no gradient) on each device."""
    use_dynamic_bsz: bool = False
    """Cut the critic's update micro-batches to ppo_max_token_len_per_gpu tokens, as the actor's."""
    ppo_max_token_len_per_gpu: int = ranged(16384, ge=1)
    """use_dynamic_bsz: prompt + response tokens per critic micro-batch on each device."""
    ppo_epochs: Optional[int] = ranged(None, ge=1, hint="or null = the actor's")
    """Passes of the critic over each step's batch; None = actor.ppo_epochs."""
    shuffle: bool = False
    """Shuffle the rows before cutting the critic's mini-batches (seeded by the step)."""
    grad_clip: float = ranged(1.0, gt=0)
    """Clip the critic's global gradient norm to this value before each optimizer step."""
    cliprange_value: float = ranged(0.5, gt=0, hint="0.5 is verl's default")
    """Value clipping: a new value may move at most this far from the value at sampling time
    before its squared error stops rewarding the move (dagrl/algos/value.py)."""
    loss_agg_mode: LossAggMode = LossAggMode.token_mean
    """How the per-token value errors become one number (as actor.loss_agg_mode)."""
