"""GKD and OPSD: the student minimises the generalized JSD to a teacher on its own samples.

Generalized knowledge distillation (Agarwal et al. 2024, "On-Policy Distillation of Language
Models: Learning from Self-Generated Mistakes", ICLR 2024): with probability ``lmbda`` a step
samples responses from the student, otherwise it takes the dataset's reference responses (the
rollout node decides, seeded by the step); the teacher scores every response position, and the
loss is the per-token divergence, aggregated by actor.loss_agg_mode, plus ``sft_alpha`` × the NLL
of the reference responses on off-policy steps.

- top-k (``gkd_logits_topk`` set): the teacher_logprob node gives the teacher's top-k next tokens
  ([B, R, K]) and the loss is ``topk_divergence`` on that support (dagrl/algos/distillation.py);
- full vocabulary (unset): the teacher_hidden node gives the teacher's final hidden states at the
  response positions ([B, R, H'], H' ≪ V), and the train backend recomputes the teacher's logits
  chunk by chunk with the teacher's output layer inside the loss, so neither the teacher's nor the
  student's [tokens, V] distributions are ever held for more than one chunk (docs/distillation.md).

OPSD (on-policy self-distillation with privileged information) is the same loss; only the
teacher's input differs: it reads each row's ``teacher_prompt`` (problem + reference solution)
before the student's response (dagrl/nodes/teacher.py), and may be the student itself
(``teacher.model=self|self_current``).

The SFT term differs from ms-swift's on purpose: ms-swift adds the NLL of whatever the step
trains on, on on-policy steps the student's own samples, which only sharpens the student toward
what it already says; here it is the NLL of the dataset's responses only, so it applies on the
off-policy steps (``lmbda < 1``).
"""

from __future__ import annotations

import json
import os

from torch import Tensor

from dagrl.algos import LossAggMode, agg_loss
from dagrl.algos.distillation import topk_divergence
from dagrl.config.roles import teacher_model_path
from dagrl.config.schema import DagrlConfig, SelfTeacher, TeacherPlacement
from dagrl.config.validate_rollout import refuse_rollout_correction
from dagrl.core.batch import Batch
from dagrl.data.builtin import tiny_model_path
from dagrl.errors import ConfigError
from dagrl.objectives.base import (
    FullVocabRequest,
    TokenOutputs,
    TokenRequest,
    micro_batch_weights,
    register_objective,
)

G = "algorithm.gkd"
TOPK_KEYS = ("teacher_topk_ids", "teacher_topk_logprobs")
HIDDEN_KEY = "teacher_hidden"
DISTILL_ALGORITHMS = ("gkd", "opsd")


class GKDObjective:
    """``agg(JSD_beta(student || teacher))`` on the teacher's top-k or over the full vocabulary,
    ``+ sft_alpha · NLL(reference responses)``; entropy reported (top-k), not in the loss."""

    # the GRPO DAG's keys, should a custom DAG hand them over; off_policy: which rows are the data's
    _GRPO_KEYS = ("old_logprobs", "rollout_logprobs", "advantages", "ref_logprobs", "off_policy")

    def __init__(self, cfg: DagrlConfig):
        g = cfg.algorithm.gkd
        self.beta, self.tail_bucket, self.sft_alpha = g.beta, g.tail_bucket, g.sft_alpha
        self.mode = LossAggMode(cfg.actor_rollout_ref.actor.loss_agg_mode)
        self.norm_length = cfg.data.max_response_length
        sft = ("off_policy",) if self.sft_alpha else ()
        self.full_vocab = g.gkd_logits_topk is None
        # one DAG serves both modes: the other mode's teacher keys are optional (its node is off)
        teacher_keys, other_keys = (
            ((HIDDEN_KEY,), TOPK_KEYS) if self.full_vocab else (TOPK_KEYS, (HIDDEN_KEY,))
        )
        self.required_keys = ("response_mask", *teacher_keys, *sft)
        self.optional_keys = (*(k for k in self._GRPO_KEYS if k not in sft), *other_keys)
        if self.full_vocab:
            # entropy would cost another pass over [tokens, V]: the divergence is the metric; the
            # sampled tokens' log-probs only for the SFT term
            # a `self` teacher of the default run has no path of its own: the shipped tiny student's
            teacher = os.path.expanduser(teacher_model_path(cfg) or _student_path(cfg))
            full = FullVocabRequest(HIDDEN_KEY, teacher, g.beta, g.temperature)
            self.request = TokenRequest(logprobs=bool(self.sft_alpha), full_vocab=full)
            return
        # the sampled tokens' log-probs only for the SFT term; entropy is a cheap metric
        self.request = TokenRequest(
            logprobs=bool(self.sft_alpha),
            entropy=True,
            logprobs_at="teacher_topk_ids",
            logprobs_at_temperature=g.temperature,
        )

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        return micro_batch_weights(mini, micro_batches, per_token=not self.mode.per_sequence)

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb["response_mask"].float()
        if self.full_vocab:
            per_token = out.divergence * mask
        else:
            per_token = topk_divergence(
                out.logprobs_at, mb["teacher_topk_logprobs"], mask, self.beta, self.tail_bucket
            )
        loss = agg_loss(per_token, mask, self.mode, self.norm_length)
        metrics = {"distill/divergence": loss.detach()}
        if self.sft_alpha:
            # off-policy rows hold the dataset's responses; on on-policy steps there are none (0)
            reference = mask * mb["off_policy"].float()[:, None]
            nll = agg_loss(-out.logprobs, reference, self.mode, self.norm_length)
            loss = loss + self.sft_alpha * nll
            metrics["distill/sft_nll"] = nll.detach()
        if out.entropy is not None:
            metrics["actor/entropy"] = agg_loss(out.entropy, mask, self.mode, self.norm_length).detach()
        return loss, metrics


def model_vocab_size(path: str) -> int | None:
    """``vocab_size`` of a local HF model directory's config.json; None if not a local directory."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return None
    with open(config) as f:
        return json.load(f).get("vocab_size")


def _student_path(cfg: DagrlConfig) -> str:
    return cfg.actor_rollout_ref.model.path or tiny_model_path()  # unset: the shipped tiny model


def _check_gkd(cfg: DagrlConfig) -> None:
    """GKD's own rules: what is implemented (on-policy, no SFT term) and what fits the models."""
    g = cfg.algorithm.gkd
    refuse_rollout_correction(cfg)
    if not 0.0 <= g.beta <= 1.0:
        raise ConfigError(f"{G}.beta", g.beta, "must be in [0, 1] (0 = forward KL, 1 = reverse KL)")
    if g.temperature <= 0:
        raise ConfigError(f"{G}.temperature", g.temperature, "must be > 0")
    if not 0.0 <= g.lmbda <= 1.0:
        raise ConfigError(f"{G}.lmbda", g.lmbda, "must be in [0, 1] (the share of on-policy steps)")
    if g.sft_alpha < 0:
        raise ConfigError(f"{G}.sft_alpha", g.sft_alpha, "must be >= 0 (0 = no SFT term)")
    if g.sft_alpha > 0 and g.lmbda == 1.0:
        raise ConfigError(
            f"{G}.sft_alpha",
            g.sft_alpha,
            "the SFT term is on the dataset's responses, which only off-policy steps train on; "
            "set algorithm.gkd.lmbda below 1 (e.g. 0.5), or sft_alpha=0",
        )
    if g.lmbda < 1.0 or g.sft_alpha > 0:
        check_responses_in_data(cfg)
    name = cfg.algorithm.name
    if cfg.teacher.model is None:
        raise ConfigError(
            "teacher.model", None, f"algorithm={name} distils from a teacher: set its model path"
        )
    if cfg.teacher.model == SelfTeacher.self_current.value and cfg.teacher.offload:
        raise ConfigError(
            "teacher.offload", True, "a self_current teacher is the train role's own model: set false"
        )
    if cfg.teacher.model == SelfTeacher.self_current.value and g.gkd_logits_topk is None:
        raise ConfigError(
            f"{G}.gkd_logits_topk",
            None,
            "a self_current teacher scores with its top-k: set e.g. 64 (the full-vocabulary path reads "
            "the teacher's output layer from its checkpoint, which is not the current policy's)",
        )
    self_teacher = cfg.teacher.model in {t.value for t in SelfTeacher}
    if self_teacher and cfg.teacher.placement != TeacherPlacement.colocate:
        raise ConfigError(
            "teacher.placement", cfg.teacher.placement, "a self teacher is the student's model: use colocate"
        )
    if g.gkd_logits_topk is not None and g.gkd_logits_topk < 1:
        raise ConfigError(
            f"{G}.gkd_logits_topk", g.gkd_logits_topk, "must be >= 1, or unset for full vocabulary"
        )
    _check_vocabularies(cfg)


def check_responses_in_data(cfg: DagrlConfig) -> None:
    """Off-policy steps and the SFT term read data.response_key: the parquet files must have it
    (the built-in task carries a `response` column)."""
    from dagrl.config.validate import data_files

    g, column = cfg.algorithm.gkd, cfg.data.response_key.partition(".")[0]
    key = f"{G}.lmbda" if g.lmbda < 1.0 else f"{G}.sft_alpha"
    for path in data_files(cfg.data.train_files):
        names = _parquet_columns(path)
        if names is not None and column not in names:
            raise ConfigError(
                key,
                g.lmbda if g.lmbda < 1.0 else g.sft_alpha,
                f"needs reference responses, but {path} has no column {column!r} (data.response_key="
                f"{cfg.data.response_key}); write one (a `response` text column, or point "
                "data.response_key at it, e.g. extra_info.answer), or set lmbda=1.0 and sft_alpha=0",
            )


def _parquet_columns(path: str) -> list[str] | None:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(os.path.expanduser(path)).names
    except (OSError, ValueError):
        return None  # unreadable: the data layer reports it with the file's name


def _check_vocabularies(cfg: DagrlConfig) -> None:
    """The teacher's vocabulary is the student's (ids index the same words), and top-k fits it."""
    g = cfg.algorithm.gkd
    student = model_vocab_size(_student_path(cfg))
    teacher = model_vocab_size(teacher_model_path(cfg) or _student_path(cfg))
    if student is not None and teacher is not None and student != teacher:
        # HF vocab_size includes the embedding padding; a mismatch means different id spaces
        raise ConfigError(
            "teacher.model",
            cfg.teacher.model,
            f"its vocabulary ({teacher}) differs from the student's ({student}): distillation compares "
            "distributions over the same token ids; use a teacher with the student's tokenizer",
        )
    vocab = teacher or student
    # full vocabulary (gkd_logits_topk unset) has no size limit: the teacher's logits are
    # recomputed chunk by chunk from its hidden states (docs/distillation.md)
    if g.gkd_logits_topk is not None and vocab is not None and g.gkd_logits_topk > vocab:
        raise ConfigError(
            f"{G}.gkd_logits_topk", g.gkd_logits_topk, f"must be <= the vocabulary size {vocab}"
        )


def distill_topk(cfg: DagrlConfig) -> int:
    """K of the teacher's top-k (top-k mode only: full vocabulary goes through teacher_hidden)."""
    k = cfg.algorithm.gkd.gkd_logits_topk
    assert k is not None, "full-vocabulary distillation runs the teacher_hidden node, not teacher_logprob"
    return k


@register_objective("gkd", validate=_check_gkd)
def gkd(cfg: DagrlConfig) -> GKDObjective:
    """GKD (Agarwal et al. 2024): generalized JSD to the teacher on its top-k support."""
    return GKDObjective(cfg)


@register_objective("opsd", validate=_check_gkd)
def opsd(cfg: DagrlConfig) -> GKDObjective:
    """OPSD: GKD whose teacher reads each row's privileged teacher_prompt (dagrl/nodes/teacher.py)."""
    return GKDObjective(cfg)
