"""Config sections of the sampling pipeline (`pipeline=sample`) and of reward models as roles.

Kept apart from schema.py (which includes them in DagrlConfig) so the sampling roles own their
settings. ms-swift's `swift sample` names are used where the concept is the same
(num_return_sequences = actor_rollout_ref.rollout.n, n_best_to_keep, sampler_type, prm_model,
orm_model, prm_threshold); verl's reward_model.* names map onto reward.model.* (docs/compat.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from dagrl.config.ranges import ranged


class SamplerType(str, Enum):
    sample = "sample"  # the policy (actor_rollout_ref.model.path) samples; rewards filter
    distill = "distill"  # a teacher (teacher.model) samples: the output is distillation data


class SampleFilter(str, Enum):
    best_of_n = "best_of_n"  # the n_best_to_keep highest-scoring responses of each prompt
    threshold = "threshold"  # every response scoring >= sample.threshold
    keep_all = "keep_all"  # every response, with its scores


class PrmAggregate(str, Enum):
    """How a PRM's per-step scores become one score per response."""

    min = "min"  # a response is as good as its weakest step (Lightman et al. 2023)
    last = "last"
    mean = "mean"


class RewardModelType(str, Enum):
    """What kind of model scores (ms-swift's reward_model_plugin: default / genrm)."""

    discriminative = "discriminative"  # a sequence-classification head read at the last token
    generative = "generative"  # an LLM judge: a prompt from judge_template, its answer parsed


class JudgeEngine(str, Enum):
    """Where a generative judge decodes."""

    hf = "hf"  # transformers, any device (CPU tests)
    vllm = "vllm"  # an in-process vLLM engine on the role's GPUs


DEFAULT_JUDGE_TEMPLATE = (
    "Rate the response to the question from 0 to 10 (10 = correct and complete).\n"
    "Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
    "Answer with 'Score: N'."
)


@dataclass
class RewardModelConfig:
    """A reward model served as a role (verl's reward_model.* names where they match)."""

    enable: bool = False
    """Run the reward model (role `rm`) and add weight × its score to the rule rewards."""
    path: str | None = None
    """HF directory of a sequence-classification model (AutoModelForSequenceClassification, one
    label), or with type=generative of a causal LM (the judge)."""
    type: RewardModelType = RewardModelType.discriminative
    """discriminative: a score head; generative: an LLM judge prompted with judge_template
    (dagrl/rewards/judge.py). ms-swift: reward_model_plugin=genrm."""
    engine: JudgeEngine = JudgeEngine.hf
    """type=generative: hf (transformers, CPU or GPU) or vllm (GPU)."""
    backend: Optional[str] = None
    """The registered reward_model backend that serves role rm: null = hf for discriminative,
    hf_judge / vllm_judge (by engine) for generative; a plugin registers its own name with
    register_backend("reward_model", name) in an external_plugins module."""
    judge_template: str = DEFAULT_JUDGE_TEMPLATE
    """type=generative: the judge's user turn; {prompt}, {response} and {ground_truth} are filled
    in (the policy's prompt and response as text, special tokens dropped)."""
    judge_score_pattern: str = r"Score:\s*(-?\d+(?:\.\d+)?)"
    """type=generative: a regular expression; its first match's first group is the score."""
    judge_score_min: float = ranged(0.0, hint="any finite number below judge_score_max")
    """type=generative: the lowest score the template asks for (maps to 0)."""
    judge_score_max: float = ranged(10.0, hint="any finite number above judge_score_min")
    """type=generative: the highest score the template asks for (maps to 1)."""
    judge_max_new_tokens: int = ranged(32, ge=1)
    """type=generative: tokens the judge may write (greedy decoding)."""
    judge_neutral_score: float = ranged(0.5, ge=0, le=1)
    """type=generative: the score of a failed judgment (no score in the answer, out of range, or a
    prompt longer than the judge's context); failures are counted in reward/judge_failures."""
    gpu_memory_utilization: float = ranged(0.5, gt=0, le=1)
    """engine=vllm: the share of each of the role's GPUs the judge's engine takes."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """engine=vllm: more vllm.LLM arguments (enforce_eager, kv_cache_dtype, ...), passed last."""
    weight: float = ranged(1.0, hint="any finite weight")
    """Weight of the model's score in the reward sum (rule rewards keep reward.functions' weights)."""
    micro_batch_size_per_gpu: int = ranged(64, ge=1)
    """Sequences per forward pass of the reward model."""
    rule_weight: float = ranged(1.0, hint="0 = the model's score alone")
    """Weight of the rule rewards (reward.functions, or the data source's) next to the model."""


@dataclass
class SampleConfig:
    """The sampling pipeline: sampler → orm / prm → filter → parquet shards (dagrl/sample)."""

    sampler_type: SamplerType = SamplerType.sample
    """sample: the policy model samples; distill: teacher.model samples (distillation data)."""
    output_dir: str = "sample_output/${trainer.experiment_name}"
    """Where the shards (shard_00000.parquet, ...) and sample_state.json go."""
    shard_size: int = ranged(64, ge=1)
    """Prompts per shard: each shard is sampled, scored, filtered and written atomically; a
    restarted job skips the shards already written."""
    filter: SampleFilter = SampleFilter.best_of_n
    """best_of_n, threshold or keep_all."""
    n_best_to_keep: int = ranged(1, ge=1)
    """best_of_n: responses kept per prompt (highest score first)."""
    threshold: float = ranged(0.5, hint="any finite score")
    """threshold: the lowest score kept."""
    orm_model: str | None = None
    """Outcome reward model (sequence-classification HF dir) on role `orm`; None = rule rewards only."""
    prm_model: str | None = None
    """Process reward model (sequence-classification HF dir) scoring each step on role `prm`; None = off."""
    step_separator: str = "\n\n"
    """Text that ends a step of a response (the PRM scores the prefix up to each step's end)."""
    prm_aggregate: PrmAggregate = PrmAggregate.min
    """How the per-step scores become the response's PRM score: min, last or mean."""
    prm_weight: float = ranged(1.0, hint="any finite weight; 0 leaves the score out")
    """Weight of the PRM score in the filter's score (next to the ORM / rule score)."""
    rule_weight: float = ranged(1.0, hint="any finite weight; 0 leaves the score out")
    """Weight of the rule rewards (reward.functions, or the data source's) in the filter's score;
    the rule score is reported (sample/reward_mean) whatever its weight."""
    orm_weight: float = ranged(1.0, hint="any finite weight; 0 leaves the score out")
    """Weight of the ORM model's score in the filter's score (next to the rule score)."""
    max_prompts: int | None = ranged(None, ge=1, hint="or null = every row")
    """Sample at most this many prompts of data.train_files (the first ones)."""
