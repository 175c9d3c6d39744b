"""The built-in backends. Implementations are imported when a role builds one, not before."""

from __future__ import annotations

import copy

from dagrl.backends.registry import register_backend, restrict_devices, start_before_others
from dagrl.config.roles import RoleKind, RoleSpec


def _train_cfg(cfg, spec: RoleSpec):
    """The config a train backend reads, pointed at the spec's model.

    Train backends read actor_rollout_ref.model; a teacher is the same backend in forward-only
    mode with its own model, so it gets a copy whose model section names the teacher's.
    """
    model = cfg.actor_rollout_ref.model
    if (spec.model.path, spec.model.dtype) == (model.path, model.dtype):
        return cfg
    cfg = copy.deepcopy(cfg)
    cfg.actor_rollout_ref.model.path = spec.model.path
    cfg.actor_rollout_ref.model.dtype = spec.model.dtype
    return cfg


def _torch(cfg, spec: RoleSpec, ctx):
    from dagrl.backends.torch.train import TorchTrainBackend

    return TorchTrainBackend(_train_cfg(cfg, spec), ctx, forward_only=not spec.trains, offload=spec.offload)


def _megatron(cfg, spec: RoleSpec, ctx):
    from dagrl.backends.megatron.train import MegatronTrainBackend

    return MegatronTrainBackend(
        _train_cfg(cfg, spec), ctx, forward_only=not spec.trains, offload=spec.offload
    )


for _kind in (RoleKind.train, RoleKind.ref, RoleKind.teacher):
    register_backend(_kind, "torch")(_torch)
    register_backend(_kind, "megatron")(_megatron)
restrict_devices(
    "megatron",
    {"cuda"},
    "the megatron backend needs GPUs (megatron-core hard-codes CUDA): run on GPUs "
    "(trainer.device=cuda), or train on the CPU with actor_rollout_ref.actor.strategy=torch",
)


@register_backend(RoleKind.rollout, "hf")
def _hf(cfg, spec: RoleSpec, ctx):
    from dagrl.backends.hf.rollout import HFRolloutBackend

    return HFRolloutBackend(
        _train_cfg(cfg, spec), ctx
    )  # the spec's model: a distill sampler's is the teacher


@register_backend(RoleKind.rollout, "vllm")
def _vllm(cfg, spec: RoleSpec, ctx):
    # imports vllm (GPU machines only); config/validate_rollout.py refuses it off the GPU, dry runs aside
    from dagrl.backends.vllm.rollout import VLLMRolloutBackend

    return VLLMRolloutBackend(_train_cfg(cfg, spec), ctx)


# vLLM asks for gpu_memory_utilization × the card at start and refuses to start when less is free:
# it starts on the empty device, then sleeps while the colocated trainer loads (core/worker.py)
start_before_others("vllm")


@register_backend(RoleKind.teacher, "vllm")
def _vllm_teacher(cfg, spec: RoleSpec, ctx):
    # teacher.placement=standalone; config/validate_teacher.py refuses it off the GPU, dry runs aside
    from dagrl.backends.vllm.teacher import VLLMTeacherBackend

    return VLLMTeacherBackend(cfg, spec, ctx)


# ---- reward models as roles (orm / prm of the sampling pipeline, rm of GRPO's reward node)
@register_backend("reward_model", "hf")
def _reward_model(cfg, spec: RoleSpec, ctx):
    from dagrl.backends.reward_model import RewardModelBackend

    return RewardModelBackend(cfg, spec, ctx)
