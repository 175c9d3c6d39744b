"""The closed sets of values the config uses (OmegaConf matches command-line values against member
names, so names equal values). Re-exported by dagrl.config.schema."""

from __future__ import annotations

from enum import Enum


class BuiltinTask(str, Enum):
    """Offline tasks that need no data files (data.train_files unset)."""

    arith = "arith"  # two-digit addition, single-turn (dagrl/data/builtin.py)
    calculator = "calculator"  # three-digit addition with a calculator tool (builtin_calculator.py)


class TruncateSide(str, Enum):
    """Which end of an over-long tool observation is cut."""

    left = "left"  # keep the end
    right = "right"  # keep the start
    middle = "middle"  # keep both ends


class TurnRewardMode(str, Enum):
    """How a multi-turn environment's per-turn rewards reach the advantage."""

    trajectory = "trajectory"  # summed into the episode's score: one advantage per episode
    turn = "turn"  # each turn's reward credited to that turn and the ones before it (GRPO)


class FilterMetric(str, Enum):
    """What dynamic sampling compares within a group (verl's algorithm.filter_groups.metric)."""

    acc = "acc"  # the task reward (`scores`): dagrl's reward functions report no separate accuracy
    score = "score"  # the task reward (`scores`), before DAPO's overlong penalty
    seq_reward = "seq_reward"  # the task reward plus the overlong penalty
    seq_final_reward = "seq_final_reward"  # seq_reward; verl adds KL in the reward too (refused with it)


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class ModelDtype(str, Enum):
    """Weight dtypes a model may be loaded in (the short names are accepted as in verl)."""

    float32 = "float32"
    fp32 = "fp32"
    bfloat16 = "bfloat16"
    bf16 = "bf16"
    float16 = "float16"
    fp16 = "fp16"


class RecomputeGranularity(str, Enum):
    full = "full"  # recompute whole layers (recompute_method + recompute_num_layers choose which)
    selective = "selective"  # recompute the attention core only


class RecomputeMethod(str, Enum):
    uniform = "uniform"
    block = "block"


class LoggerName(str, Enum):
    console = "console"
    tensorboard = "tensorboard"
    wandb = "wandb"  # optional import: pip install wandb
    jsonl = "jsonl"  # always written; accepted for verl compatibility


class ResumeMode(str, Enum):
    """trainer.resume_mode: these two words, or the path of a global_step_N directory."""

    auto = "auto"
    disable = "disable"


def parse_resume_mode(value: str) -> ResumeMode | str:
    """ResumeMode for the two keywords, else the value as a checkpoint path (user-expanded)."""
    import os

    if value in ResumeMode._value2member_map_:
        return ResumeMode(value)
    return os.path.expanduser(value)


class LayerSpec(str, Enum):
    """Megatron transformer-layer implementation. auto = te when TransformerEngine imports, else sdpa."""

    auto = "auto"
    te = "te"  # TransformerEngine fused layers (needed for context parallel)
    sdpa = "sdpa"  # dagrl's: PyTorch fused scaled-dot-product attention + SP-capable RMSNorm
    local = "local"  # megatron-core's local spec (unfused attention; no sequence parallel)


class TeacherPlacement(str, Enum):
    """Where the teacher model runs."""

    colocate = "colocate"  # a train backend in forward-only mode, its own model, on the train devices
    standalone = "standalone"  # vLLM replicas on devices of their own (teacher.gpus)


class SelfTeacher(str, Enum):
    """Words `teacher.model` accepts instead of a path: the student distils from itself."""

    self = "self"  # a frozen copy of the student's initial weights (forward-only, like the reference)
    self_current = "self_current"  # the policy being trained, in no-grad mode, on the train workers


class RolloutISLevel(str, Enum):
    token = "token"
    sequence = "sequence"


class RolloutRSLevel(str, Enum):
    token = "token"
    sequence = "sequence"
    geometric = "geometric"


class LoraSync(str, Enum):
    """How a LoRA actor's weights reach the rollout engine (actor_rollout_ref.rollout.lora_sync)."""

    auto = "auto"  # adapter to a LoRA-serving engine on devices of its own, else merged
    adapter = "adapter"  # the adapter tensors only; the engine applies them (vLLM's LoRA support)
    merged = "merged"  # base + scale · B·A under the base's names: any engine, no LoRA kernels


class CpuAffinity(str, Enum):
    """Which CPUs a GPU worker's threads may run on (trainer.cpu_affinity)."""

    none = "none"  # where Ray and the OS put them (the process's affinity as it starts)
    gpu_local = "gpu_local"  # the CPUs local to the worker's GPU, within the process's affinity
