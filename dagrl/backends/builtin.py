"""The built-in backends, each with its own rules. Implementations are imported when a role builds
one, not before. Every backend is built from its role's spec: a train backend builds the model of
the spec (a teacher or a reference is the same backend, forward-only, with its own spec), a rollout
engine samples with the spec's model and `rollout` section (a distill sampler's model is the
teacher's), a standalone teacher and a reward model read their own specs."""

from __future__ import annotations

from dagrl.backends.hf import memory as hf_memory
from dagrl.backends.hf.rules import check_hf_rollout
from dagrl.backends.megatron import memory as megatron_memory
from dagrl.backends.megatron.critic_rules import check_megatron_critic, check_megatron_critic_plan
from dagrl.backends.megatron.hooks import MEGATRON_HOOKS
from dagrl.backends.megatron.rules import (
    check_megatron,
    check_megatron_plan,
    check_megatron_teacher,
    check_megatron_unused,
    resolve_megatron,
)
from dagrl.backends.registry import describe_backend, register_backend, restrict_devices, start_before_others
from dagrl.backends.torch import memory as torch_memory
from dagrl.backends.torch.hooks import TORCH_HOOKS
from dagrl.backends.torch.rules import check_torch
from dagrl.backends.vllm import memory as vllm_memory
from dagrl.backends.vllm.engine_args import LORA_SERVING_DTYPES
from dagrl.backends.vllm.rules import (
    VLLM_ROLLOUT_KEYS,
    check_rollout_device,
    check_teacher_device,
    check_vllm_rollout,
    check_vllm_teacher,
)
from dagrl.config.roles import Role, RoleSpec
from dagrl.config.schema import MegatronConfig
from dagrl.config.validate_critic import check_critic_plan


def _torch(spec: RoleSpec, ctx, objective):
    from dagrl.backends.torch.train import TorchTrainBackend

    return TorchTrainBackend(spec, ctx, objective)


def _megatron(spec: RoleSpec, ctx, objective):
    from dagrl.backends.megatron.train import MegatronTrainBackend

    return MegatronTrainBackend(spec, ctx, objective)


# the train kind carries the rules of the whole backend (actor and its ref); a colocated megatron
# teacher adds its own (it runs in the actor's parallel groups). Each brings its memory estimate
# (backends/*/memory.py) and the train kind its checkpoint estimate.
_TORCH = dict(estimate=torch_memory.role_memory, hooks=TORCH_HOOKS)
_MEGATRON = dict(estimate=megatron_memory.role_memory, hooks=MEGATRON_HOOKS)
register_backend(Role.train, "torch", rules=check_torch, checkpoint=torch_memory.checkpoint_size, **_TORCH)(
    _torch
)
register_backend(
    Role.train,
    "megatron",
    rules=check_megatron,
    unused_rules=check_megatron_unused,
    plan_rules=check_megatron_plan,
    resolve=resolve_megatron,
    checkpoint=megatron_memory.checkpoint_size,
    **_MEGATRON,
)(_megatron)
for _kind in (Role.ref, Role.teacher):
    register_backend(_kind, "torch", **_TORCH)(_torch)
register_backend(Role.ref, "megatron", **_MEGATRON)(_megatron)
register_backend(Role.teacher, "megatron", rules=check_megatron_teacher, **_MEGATRON)(_megatron)


@register_backend(
    Role.critic,
    "torch",
    plan_rules=check_critic_plan,
    estimate=torch_memory.critic_memory,
    checkpoint=torch_memory.checkpoint_size,
)
def _torch_critic(spec: RoleSpec, ctx, objective):
    from dagrl.backends.torch.critic import TorchCriticBackend

    return TorchCriticBackend(spec, ctx)


@register_backend(
    Role.critic,
    "megatron",
    rules=check_megatron_critic,
    plan_rules=check_megatron_critic_plan,
    estimate=megatron_memory.critic_memory,
    checkpoint=megatron_memory.checkpoint_size,
)
def _megatron_critic(spec: RoleSpec, ctx, objective):
    from dagrl.backends.megatron.critic import MegatronCriticBackend

    return MegatronCriticBackend(spec, ctx)


restrict_devices(
    "megatron",
    {"cuda"},
    "the megatron backend needs GPUs (megatron-core hard-codes CUDA): run on GPUs "
    "(trainer.device=cuda), or train on the CPU with actor_rollout_ref.actor.strategy=torch",
)


@register_backend(
    Role.rollout,
    "hf",
    rules=check_hf_rollout,
    estimate=hf_memory.role_memory,
    reads=("micro_batch_size_per_gpu",),
)
def _hf(spec: RoleSpec, ctx, objective):
    from dagrl.backends.hf.rollout import HFRolloutBackend

    return HFRolloutBackend(spec, ctx)


@register_backend(
    Role.rollout,
    "vllm",
    rules=check_vllm_rollout,
    device_rules=check_rollout_device,
    estimate=vllm_memory.rollout_memory,
    reads=VLLM_ROLLOUT_KEYS,
)
def _vllm(spec: RoleSpec, ctx, objective):
    # imports vllm (GPU machines only); check_rollout_device refuses it off the GPU, dry runs aside
    from dagrl.backends.vllm.rollout import VLLMRolloutBackend

    return VLLMRolloutBackend(spec, ctx)


# vLLM serves a LoRA adapter beside its base weights (its kernels in 16-bit), and the standalone
# teacher's replicas; megatron reads a section of its own in actor.*, ref.* and critic.* (torch
# reads those sections themselves, a rollout engine rollout.*: no section of their own)
describe_backend("vllm", lora_dtypes=LORA_SERVING_DTYPES, standalone_teacher=True)
describe_backend("megatron", config_type=MegatronConfig)

# vLLM asks for gpu_memory_utilization × the card at start and refuses to start when less is free:
# it starts on the empty device, then sleeps while the colocated trainer loads (core/worker.py)
start_before_others("vllm")


@register_backend(
    Role.teacher,
    "vllm",
    rules=check_vllm_teacher,
    device_rules=check_teacher_device,
    estimate=vllm_memory.teacher_memory,
)
def _vllm_teacher(spec: RoleSpec, ctx, objective):
    # teacher.placement=standalone; check_teacher_device refuses it off the GPU, dry runs aside
    from dagrl.backends.vllm.teacher import VLLMTeacherBackend

    return VLLMTeacherBackend(spec, ctx)


# ---- reward models as roles (orm / prm of the sampling pipeline, rm of GRPO's reward node)
# a reward model's estimate is its scoring pass (hf/memory.py: score_memory), one phase per model
@register_backend("reward_model", "hf", estimate=hf_memory.score_memory)
def _reward_model(spec: RoleSpec, ctx, objective):
    from dagrl.backends.reward_model import RewardModelBackend

    return RewardModelBackend(spec, ctx)


def _check_judge(cfg) -> None:
    """A generative judge's own settings: a score range that maps onto [0, 1], a template that
    names only the fields the driver fills in."""
    from dagrl.errors import ConfigError
    from dagrl.rewards.judge import TEMPLATE_FIELDS, render_judge_prompt

    m = cfg.reward.model
    if not m.judge_score_min < m.judge_score_max:
        raise ConfigError(
            "reward.model.judge_score_max",
            m.judge_score_max,
            f"must be above reward.model.judge_score_min ({m.judge_score_min})",
        )
    try:
        render_judge_prompt(m.judge_template, "", "", "")
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            "reward.model.judge_template",
            m.judge_template,
            f"is not a template of {{{'}, {'.join(TEMPLATE_FIELDS)}}} ({e!r}); write literal braces as {{{{ }}}}",
        ) from e


def _check_judge_device(cfg, device: str) -> None:
    import importlib.util

    from dagrl.errors import ConfigError

    if cfg.trainer.dry_run:
        return
    if device != "cuda":
        raise ConfigError(
            "reward.model.engine",
            "vllm",
            "a vLLM judge needs GPUs: trainer.device=cuda, or reward.model.engine=hf",
        )
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "reward.model.engine", "vllm", "vllm is not installed here; pip install -e '.[vllm]'"
        )


@register_backend("reward_model", "hf_judge", rules=_check_judge)
def _hf_judge(spec: RoleSpec, ctx, objective):
    from dagrl.backends.judge import HFJudgeBackend

    return HFJudgeBackend(spec, ctx)


@register_backend("reward_model", "vllm_judge", rules=_check_judge, device_rules=_check_judge_device)
def _vllm_judge(spec: RoleSpec, ctx, objective):
    from dagrl.backends.vllm.judge import VLLMJudgeBackend

    return VLLMJudgeBackend(spec, ctx)


start_before_others("vllm_judge")
