"""Backend registry: a role's backend is chosen by config (strategy / rollout name)."""

from __future__ import annotations

from dagrl.config.placement import ROLE_REF, ROLE_ROLLOUT, ROLE_TRAIN
from dagrl.config.schema import DagrlConfig, RolloutName, TrainStrategy
from dagrl.errors import ConfigError


def build_backend(cfg: DagrlConfig, role: str, ctx):
    arr = cfg.actor_rollout_ref
    if role in (ROLE_TRAIN, ROLE_REF):
        if arr.actor.strategy == TrainStrategy.megatron:
            from dagrl.backends.megatron.train import MegatronTrainBackend

            return MegatronTrainBackend(cfg, ctx, forward_only=(role == ROLE_REF))
        from dagrl.backends.torch.train import TorchTrainBackend

        return TorchTrainBackend(cfg, ctx, forward_only=(role == ROLE_REF))
    if role == ROLE_ROLLOUT:
        if arr.rollout.name == RolloutName.vllm:
            from dagrl.backends.vllm.rollout import VLLMRolloutBackend  # imports vllm: GPU machines only

            return VLLMRolloutBackend(cfg, ctx)
        from dagrl.backends.hf.rollout import HFRolloutBackend

        return HFRolloutBackend(cfg, ctx)
    raise ConfigError("placement.colocate_groups", role, "unknown role; roles are train, rollout, ref")
