"""Typed config schemas, registered in Hydra's ConfigStore: the root `DagrlConfig` and its sections.

Key names follow verl/siiRL where the concept exists. Defaults live on the schema and nowhere else.
The large sections live in modules of their own (actor_schema.py: model, actor, ref;
rollout_schema.py: the rollout engine; algorithm_schema.py; sample_schema.py) and are re-exported
here, so `from dagrl.config.schema import RolloutConfig` keeps working.
An unknown key or a value of the wrong type fails at the command line, naming the key.
Dataclasses stay unfrozen: Hydra must be able to apply overrides to them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from dagrl.algos.losses import KLEstimator, LossAggMode  # noqa: F401  (re-exported)
from dagrl.config.actor_schema import (  # noqa: F401  (re-exported)
    ActorConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
)
from dagrl.config.algorithm_schema import (  # noqa: F401  (re-exported)
    AlgorithmConfig,
    DistillRewardConfig,
    FilterGroupsConfig,
    GKDConfig,
    KLCtrlConfig,
    RolloutCorrectionConfig,
)
from dagrl.config.critic_schema import CriticConfig, CriticModelConfig  # noqa: F401  (re-exported)
from dagrl.config.enums import (  # noqa: F401  (re-exported: config users import them from here)
    BuiltinTask,
    CpuAffinity,
    Device,
    FilterMetric,
    LayerSpec,
    LoggerName,
    LoraSync,
    ModelDtype,
    RecomputeGranularity,
    RecomputeMethod,
    ResumeMode,
    RolloutISLevel,
    RolloutRSLevel,
    SelfTeacher,
    TeacherPlacement,
    TruncateSide,
    TurnRewardMode,
    parse_resume_mode,
)
from dagrl.config.ranges import ranged
from dagrl.config.rollout_schema import (  # noqa: F401  (re-exported)
    MultiTurnConfig,
    RolloutConfig,
    SamplingConfig,
    VLLMEngineKwargs,
)
from dagrl.config.sample_schema import RewardModelConfig, SampleConfig


@dataclass
class DataConfig:
    train_files: Optional[Any] = None
    """Parquet file(s) of training rows (examples/data_preprocess); None = the built-in task."""
    val_files: Optional[Any] = None
    """Parquet file(s) of validation rows; None = the built-in task's test split (or none with train_files)."""
    prompt_key: str = "prompt"
    """Column holding each row's chat messages."""
    response_key: str = "response"
    """Column holding each row's reference response (text; ms-swift's query/response naming), read
    by distillation's off-policy steps and SFT term (algorithm.gkd.lmbda < 1, sft_alpha > 0).
    `column.key` reads a key of a dict column: `extra_info.answer` is verl's
    response_key=extra_info with response_dict_keys=[answer]."""
    train_batch_size: int = ranged(16, ge=1)
    """Prompts per step (each sampled rollout.n times)."""
    val_batch_size: Optional[int] = ranged(None, ge=1)
    """Validation prompts generated at once; None = all of them in one batch."""
    max_prompt_length: int = ranged(32, ge=1)
    """Longest prompt in tokens; longer ones are dropped (filter_overlong_prompts) or refused."""
    max_response_length: int = ranged(8, ge=1)
    """Most tokens sampled per response."""
    filter_overlong_prompts: bool = True
    """Drop prompts over max_prompt_length instead of failing on them."""
    shuffle: bool = True
    """Shuffle the training rows every epoch."""
    seed: int = ranged(1, ge=0)
    """Seed of the shuffle and of the built-in task's generator."""
    builtin_task: BuiltinTask = BuiltinTask.arith
    """The built-in task when data.train_files is unset: arith, or calculator (multi-turn, with
    its own tiny model when actor_rollout_ref.model.path is unset)."""
    builtin_train_rows: int = ranged(2048, ge=1)
    """Rows of the built-in task's training split."""
    builtin_val_rows: int = ranged(128, ge=1)
    """Rows of the built-in task's validation split."""


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy's model (the reference starts from it too)."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy's training."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling responses."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The frozen reference model (KL loss / KL in reward)."""


@dataclass
class RewardTermConfig:
    name: str = "gsm8k"
    """A registered reward function (built-in or from external_plugins)."""
    weight: float = ranged(1.0, hint="any finite weight; negative ones penalise")
    """Its weight in the sum."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments passed to the function on every call (verl's
    custom_reward_function.reward_kwargs); refused before the run if its signature does not take them."""


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (verl's reward_model.overlong_buffer; dagrl/algos/dapo.py):
    a training response longer than data.max_response_length - len loses up to penalty_factor,
    linearly, at the limit. Validation reports the task reward without it."""

    enable: bool = False
    """Add the overlong penalty to the training rewards."""
    len: Optional[int] = ranged(None, ge=1, hint="or null = a fifth of data.max_response_length")
    """Tokens before data.max_response_length over which the penalty grows from 0 (DAPO: 4096 of
    20480); must be below data.max_response_length. None = a fifth of it (at least 1)."""
    penalty_factor: float = ranged(1.0, ge=0)
    """The penalty at data.max_response_length."""


@dataclass
class RewardConfig:
    functions: list[RewardTermConfig] = field(default_factory=list)
    """Weighted reward functions; empty = pick the reward by each row's data_source (gsm8k, math, arith)."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A reward model served as role `rm` (verl's reward_model.*), added to the rule rewards by weight."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong punishment on the training rewards (verl's reward_model.overlong_buffer)."""


@dataclass
class TeacherConfig:
    """The distillation teacher. The role exists only when `model` is set."""

    model: Optional[str] = None
    """HF model path or hub id of the teacher; None = no teacher role. `self`: a frozen copy of
    the student's initial weights; `self_current`: the policy being trained, in no-grad mode on
    the train workers (no teacher role): on-policy self-distillation."""
    dtype: Optional[ModelDtype] = None
    """Weights dtype (float32, bfloat16, float16); None = actor_rollout_ref.model.dtype."""
    placement: TeacherPlacement = TeacherPlacement.colocate
    """colocate: forward-only train backend on the train devices; standalone: vLLM on teacher.gpus."""
    gpus: int = ranged(0, ge=0)
    """Devices of a standalone teacher; 0 = an even share of the declared cluster with the other
    groups (standalone), or none of its own (a colocated teacher uses the train devices)."""
    tensor_model_parallel_size: int = ranged(1, ge=1)
    """vLLM tensor parallel size of a standalone teacher; must divide teacher.gpus."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the standalone teacher's vLLM engine."""
    offload: bool = False
    """Keep a colocated teacher's weights in host memory between its forwards (ms-swift offload_teacher_model)."""
    log_prob_micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Sequences per forward pass of the teacher."""


@dataclass
class PlacementConfig:
    # the built-in roles are listed so `placement.gpus.rollout=2` overrides without a `+`
    gpus: dict[str, Optional[int]] = ranged(
        default_factory=lambda: {
            "train": None,
            "rollout": None,
            "ref": None,
            "teacher": None,
            "critic": None,
        },
        ge=0,
    )
    """Devices per role (CPU slots when trainer.device=cpu); None = an even share of what is left."""
    colocate_groups: list[list[str]] = field(default_factory=lambda: [["train", "rollout", "ref"]])
    """Roles listed together share devices and take turns; every other role owns its devices."""
    device_groups: Optional[Any] = None
    """ms-swift's form instead of gpus + colocate_groups: {nproc_per_node, <group>: {device: GPU|CPU,
    ranks: [..] | n | 'list(range(a, b))', workers: [roles]}}, or the same as a JSON string.
    See dagrl/config/device_groups.py."""


@dataclass
class TrainerConfig:
    nnodes: int = ranged(1, ge=1)
    """Nodes of the cluster the plan is made for."""
    n_gpus_per_node: int = ranged(1, ge=1)
    """Devices per node of the cluster the plan is made for."""
    device: Device = Device.auto
    """auto, cpu or cuda. auto = cuda when a GPU is visible; on a machine without one a real run uses
    CPU slots, and a dry run plans GPUs when the declared cluster has more than one device
    (trainer.nnodes × trainer.n_gpus_per_node > 1): the plan is for the cluster named."""
    total_epochs: int = ranged(30, ge=1)
    """Passes over the training rows (as in verl; total_training_steps, when set, stops earlier)."""
    total_training_steps: Optional[int] = ranged(None, ge=1, hint="or null = total_epochs")
    """Steps to train; None = total_epochs decide (verl's default). The default job sets 40."""
    logger: list[LoggerName] = field(default_factory=lambda: [LoggerName.console, LoggerName.tensorboard])
    """Metric sinks: console, tensorboard, wandb (WANDB_MODE=offline works without a network);
    metrics.jsonl is always written. Same metric names in each."""
    project_name: str = "dagrl"
    """Project name (checkpoint and log directories)."""
    experiment_name: str = "default"
    """Experiment name (checkpoint and log directories)."""
    save_freq: int = ranged(-1, ge=1, also=(-1,), hint="-1 = never")
    """Save a checkpoint every this many steps and at the end; -1 = never."""
    save_hf: bool = False
    """Also write actor_hf/ (a transformers model directory) into every checkpoint."""
    test_freq: int = ranged(10, ge=1, also=(-1,), hint="-1 = never")
    """Validate every this many steps and at the end; -1 = never."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate once and stop, taking no step (verl's key): the current weights (the checkpoint
    resume_mode picks, else the model's own), synced to the rollout engine first, on data.val_files
    (the built-in task's test rows when data.train_files is unset)."""
    resume_mode: str = "auto"
    """auto (latest checkpoint in default_local_dir), disable, or a global_step_N directory."""
    max_actor_ckpt_to_keep: Optional[int] = ranged(2, ge=1, hint="or null = keep all")
    """Checkpoints kept in default_local_dir after each save: the highest-numbered global_step_N up
    to the step saved, lower ones (an earlier run's too) deleted; higher ones, an earlier run's that
    went further, are left alone. None = all, verl's default. ms-swift: save_total_limit."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Where checkpoints and metrics.jsonl go."""
    max_consecutive_skipped_steps: int = ranged(3, ge=0)
    """Stop the run when more steps than this in a row had an update skipped for a non-finite loss,
    gradient or reward (each skip is warned and counted in train/skipped_steps); 0 = stop at the first."""
    dry_run: bool = False
    """Print the placement plan and stop before Ray starts."""
    seed: int = ranged(1, ge=0)
    """Seed of model initialisation and of every step's sampling."""
    ray_address: Optional[str] = None
    """None = start a local Ray; auto = join the running cluster; or its address."""
    progress_bar: bool = True
    """Show a progress bar over the steps."""
    gpu_memory_gib: Optional[float] = ranged(None, gt=0, hint="or null = detected")
    """GPU memory per device the plan's estimate is checked against (a dry run warns, a run refuses
    before Ray starts); None = the visible GPU's, or 80 in a dry run on a machine without one.
    Below the GPU's size it is also what the vLLM engines take their share of (a GPU shared with
    other work): gpu_memory_utilization then applies to this figure, not to the whole device."""
    critic_warmup: int = ranged(0, ge=0)
    """Steps at the start in which only the critic updates (the actor waits for useful values);
    needs the critic (algorithm.adv_estimator=gae)."""
    host_memory_gib: Optional[float] = ranged(None, gt=0, hint="or null = detected")
    """Host memory per node the plan's host state (offloaded weights and optimizer state, a CPU
    optimizer, an engine's weights asleep) is checked against, within 90 %; None = this machine's
    in a real run (nodes alike), unchecked in a dry run. GPU plans only: a CPU run keeps everything
    in host memory and has no device plan to check."""
    cpu_affinity: CpuAffinity = CpuAffinity.none
    """none (the default until measured on the GPU hosts) or gpu_local: each GPU worker pins its
    threads to the CPUs local to its GPU (the card's PCI local_cpulist, else nvidia-smi topo -m),
    within the CPUs the process may use, before its roles build; one line per worker says which.
    vLLM's decode loop waits on the host's CPU, and on a two-socket host threads on the far socket
    reach the card and its memory across the interconnect. Nothing to do on a CPU device (said once)."""


@dataclass
class DagrlConfig:
    dag: str = "grpo"
    """The step's DAG: conf/dags/<dag>.yaml."""
    external_plugins: list[str] = field(default_factory=list)
    """Modules or .py files imported first (driver and workers): node kinds, rewards, backends."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and validation data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy model, its training, rollout and reference (verl's tree)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """The objective and advantage settings."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Reward functions."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Devices per role and which roles share them."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Cluster, steps, logging, checkpoints."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The distillation teacher (none by default)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """PPO's value model (runs with algorithm.adv_estimator=gae; none otherwise)."""
    sample: SampleConfig = field(default_factory=SampleConfig)
    """The sampling pipeline (pipeline=sample): no training, parquet shards out."""
    roles: dict[str, Any] = field(default_factory=dict)
    """Plugin roles: `+roles.judge=my_judge` (the backend registered as ("judge", "my_judge")) or the
    role's own section (`PluginRoleConfig`), e.g. `+roles.judge={backend:my_judge,model:/ckpt/j}`."""


def register_configs() -> None:
    """Register the root schema so conf/config.yaml can extend it."""
    ConfigStore.instance().store(name="dagrl_schema", node=DagrlConfig)
