"""The objective's and the advantage's settings: `algorithm.*` (KL control, rollout correction, GKD,
the distillation reward). Part of the typed schema; import the types from dagrl.config.schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dagrl.algos.losses import KLEstimator
from dagrl.config.enums import FilterMetric, RolloutISLevel, RolloutRSLevel
from dagrl.config.ranges import ranged


@dataclass
class KLCtrlConfig:
    kl_coef: float = ranged(0.001, ge=0)
    """Weight of the KL penalty subtracted from the token rewards (algorithm.use_kl_in_reward)."""


@dataclass
class RolloutCorrectionConfig:
    """verl's algorithm.rollout_correction (dagrl/algos/rollout_correction.py)."""

    rollout_is: Optional[RolloutISLevel] = None
    """Importance weights π_old/π_rollout on the policy gradient: token, sequence, or null (off)."""
    rollout_is_threshold: float = ranged(2.0, gt=0, hint="2.0 is usual")
    """Truncation of the importance weights (TIS)."""
    rollout_rs: Optional[RolloutRSLevel] = None
    """Reject tokens (token) or whole responses (sequence, geometric mean) whose ratio leaves the
    bounds below; null = off."""
    rollout_rs_threshold: float = ranged(2.0, gt=0, hint="2.0 is usual")
    """Upper bound of the accepted ratio."""
    rollout_rs_threshold_lower: Optional[float] = ranged(
        None, gt=0, hint="or null = 1 / rollout_rs_threshold"
    )
    """Lower bound of the accepted ratio; None = 1 / rollout_rs_threshold."""


@dataclass
class GKDConfig:
    """Generalized knowledge distillation (Agarwal et al. 2024); ms-swift's key names, nested so that
    `temperature` does not collide with rollout.temperature."""

    beta: float = ranged(0.5, ge=0, le=1, hint="0 = forward KL, 1 = reverse KL")
    """Generalized JSD interpolation: 0 = KL(teacher||student), 1 = KL(student||teacher)."""
    temperature: float = ranged(1.0, gt=0)
    """Both models' logits are divided by it before the divergence (not the sampling temperature)."""
    gkd_logits_topk: Optional[int] = ranged(None, ge=1, hint="or null = the full vocabulary")
    """Distil on the teacher's top-k ids only; None = the full vocabulary, of any size: the teacher
    hands over its final hidden states and the loss recomputes its logits chunk by chunk
    (docs/distillation.md). A standalone (vLLM) or self_current teacher needs top-k."""
    tail_bucket: bool = False
    """Top-k: keep the mass outside the teacher's top-k as one extra outcome instead of renormalising."""
    lmbda: float = ranged(1.0, ge=0, le=1)
    """Probability that a step trains on the student's own samples; the other steps (drawn from
    trainer.seed and the step number, so resumes repeat them) train on the dataset's responses
    (data.response_key) instead of sampling."""
    sft_alpha: float = ranged(0.0, ge=0)
    """Weight of an NLL (SFT) term on the dataset's responses, added on the off-policy steps."""


@dataclass
class DistillRewardConfig:
    """On-policy distillation as a reward (Thinking Machines' "On-Policy Distillation", slime): the
    per-token reverse KL of the sampled tokens, ``log π_student − log π_teacher``, enters the
    advantages as ``−coef × k1`` (held constant), next to any task-reward advantage."""

    coef: float = ranged(0.0, ge=0)
    """Weight of the per-token reverse-KL advantage; 0 = off. Needs teacher.model (the teacher's
    log-probs of the sampled tokens come from the teacher_logprob node)."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl's algorithm.filter_groups; dagrl/trainer/dynamic_sampling.py):
    groups whose responses all got the same metric are dropped and more prompts are sampled until
    data.train_batch_size groups are left."""

    enable: bool = False
    """Drop groups of equal metric and refill the batch with more sampled prompts."""
    metric: FilterMetric = FilterMetric.acc
    """What is compared within a group: acc or score (the task reward), seq_reward (with the
    overlong penalty, reward.overlong_buffer), seq_final_reward (the same here; KL in the reward
    is computed after the filter, so it is refused with algorithm.use_kl_in_reward)."""
    max_num_gen_batches: int = ranged(0, ge=0, hint="0 = no cap")
    """Most rounds of data.train_batch_size prompts sampled for one step; 0 = no cap. A step that
    reaches the cap short of groups is filled with dropped ones (advantage 0), with a warning:
    verl stops the run there."""


@dataclass
class AlgorithmConfig:
    name: str = "grpo"
    """Registered objective of the actor update: grpo, dr_grpo, gspo, dapo, gkd, opsd, sft
    (dagrl/objectives) or a plugin's. Choose a built-in with its preset (`algorithm=dapo`), which
    sets the keys it relies on too; presets rloo, reinforce_plus_plus and ppo (with a critic) keep
    grpo and set algorithm.adv_estimator."""
    adv_estimator: str = "grpo"
    """Registered advantage estimator: grpo (each response against its group's mean and std),
    rloo (against the mean of the rest of its group), reinforce_plus_plus (discounted token returns
    whitened over the batch, no group), reinforce_plus_plus_baseline (group mean removed, then
    whitened over the batch), gae (GAE on a critic's values, in a DAG with a critic: preset
    algorithm=ppo); dagrl/objectives/advantage.py."""
    gamma: float = ranged(1.0, ge=0, le=1)
    """Discount per policy token of reinforce_plus_plus's and GAE's returns (verl's algorithm.gamma)."""
    lam: float = ranged(1.0, ge=0, le=1)
    """GAE's λ (verl's algorithm.lam): 1 = Monte-Carlo returns minus the critic's value, 0 = one-step
    TD errors; read by algorithm.adv_estimator=gae only."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-relative advantages by the group's std (GRPO); false subtracts only the group
    mean (Dr. GRPO: the std up-weights prompts that are nearly always or never solved)."""
    use_kl_in_reward: bool = False
    """Subtract kl_ctrl.kl_coef × KL(actor || reference) from the token rewards before the
    advantages; runs the reference model (ref_logprob)."""
    kl_penalty: KLEstimator = KLEstimator.k1
    """Estimator of the in-reward KL: k1, k2, k3 or abs (verl's kl, mse, low_var_kl accepted)."""
    kl_ctrl: KLCtrlConfig = field(default_factory=KLCtrlConfig)
    """Fixed KL coefficient of the in-reward penalty."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights / rejection for the rollout-vs-trainer mismatch (verl's names)."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling: groups of equal reward dropped, the batch refilled (verl's names)."""
    gkd: GKDConfig = field(default_factory=GKDConfig)
    """Distillation settings of algorithm.name=gkd and opsd (presets `algorithm=gkd|opsd`)."""
    distill_reward: DistillRewardConfig = field(default_factory=DistillRewardConfig)
    """Reverse KL to the teacher as a per-token advantage term, combinable with GRPO's."""
