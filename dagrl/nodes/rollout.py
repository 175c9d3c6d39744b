"""rollout: one sampled response per row on the rollout pool (or, on a distillation run's
off-policy steps, the dataset's reference responses instead)."""

from __future__ import annotations

import random

import torch

from dagrl.backends.handles import rollout_role
from dagrl.core.batch import Batch
from dagrl.core.metrics import reduce_all
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.rollout.multi_turn import ROW_KEYS

# multi-turn rollouts (dagrl/rollout) also give these; a DAG lists the ones it uses
MULTI_TURN_OUTPUTS = ("response_attention_mask", "turn_ids", "turn_rewards", "env_rewards")


def step_seed(seed: int, step: int, sample_round: int = 0) -> int:
    """Sampling seed of a step: the same step of a resumed run samples the same responses. A
    further round of the same step (dynamic sampling) gets a seed of its own."""
    base = (seed * 1_000_003 + step) % (2**31)
    return base if sample_round == 0 else (base * 7_919 + sample_round * 104_729) % (2**31)


def is_off_policy_step(seed: int, step: int, lmbda: float) -> bool:
    """Whether `step` trains on the dataset's responses (probability 1 − lmbda, GKD's λ).

    A pure function of (seed, step), so a resumed run repeats the same choices and no random
    state has to be saved."""
    return random.Random(f"lmbda:{seed}:{step}").random() >= lmbda


@register_node_kind("rollout")
class RolloutNode:
    """With the reference responses among its inputs (the distillation DAGs) and lmbda < 1, a
    step drawn off-policy skips sampling and passes the dataset's responses on instead; `off_policy`
    marks the rows whose responses came from the data."""

    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ("dataset_responses", "dataset_response_mask", *ROW_KEYS)
    outputs = ("responses", "response_mask", "rollout_logprobs", "off_policy", *MULTI_TURN_OUTPUTS)
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        self.lmbda = cfg.algorithm.gkd.lmbda if "dataset_responses" in spec.inputs else 1.0
        self.max_turns = cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        seed = runtime.cfg.trainer.seed
        if self.lmbda < 1.0 and is_off_policy_step(seed, runtime.step, self.lmbda):
            return self._dataset_responses(batch)
        handle = rollout_role(runtime, self.spec.role)
        out, per_rank = handle.generate(
            batch.select(("prompts", "prompt_mask", *ROW_KEYS)),
            seed=step_seed(seed, runtime.step, runtime.sample_round),
        )
        out = out.select(self.spec.outputs)
        metrics = reduce_all(per_rank)  # the fullest card per phase, mean generate seconds
        metrics["rollout/tokens_per_s"] = sum(m["rollout/tokens_per_s"] for m in per_rank)  # all replicas
        if "off_policy" in self.spec.outputs:
            out = out.union(Batch({"off_policy": torch.zeros(len(batch))}))
            metrics["distill/off_policy_step"] = 0.0
        return NodeResult(out, metrics)

    def _dataset_responses(self, batch: Batch) -> NodeResult:
        """The dataset's responses; in a multi-turn DAG each is an episode of one turn, all its
        tokens the policy's and no environment reward."""
        responses, mask = batch["dataset_responses"], batch["dataset_response_mask"]
        out = {
            "responses": responses,
            "response_mask": mask,
            # not sampled: no rollout log-probs (distillation objectives do not read them)
            "rollout_logprobs": torch.zeros(mask.shape, dtype=torch.float32),
            "off_policy": torch.ones(len(batch)),
            "response_attention_mask": mask,
            "turn_ids": torch.where(mask.bool(), 0, -1),
            "turn_rewards": torch.zeros((len(batch), self.max_turns)),
            "env_rewards": torch.zeros(len(batch)),
        }
        return NodeResult(
            Batch({k: v for k, v in out.items() if k in self.spec.outputs}), {"distill/off_policy_step": 1.0}
        )


@register_node_kind("val_rollout")
class ValRolloutNode:
    """Validation sampling: rollout.val_kwargs, one fixed seed, any number of rows, generated in
    chunks of data.val_batch_size prompts (all at once when unset)."""

    required_inputs = ("prompts", "prompt_mask")
    optional_inputs = ROW_KEYS
    outputs = ("responses", "response_mask", "rollout_logprobs", *MULTI_TURN_OUTPUTS)
    remote = True

    def __init__(self, spec, cfg):
        self.spec = spec
        size = cfg.data.val_batch_size
        self.rows = size * cfg.actor_rollout_ref.rollout.val_kwargs.n if size else None

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        handle = rollout_role(runtime, self.spec.role)
        outs = []
        for chunk in batch.chunks(self.rows or len(batch)):
            pad = (-len(chunk)) % handle.dp_size  # pad with repeats so every DP rank gets a shard
            padded = Batch.concat([chunk, chunk.index(range(pad))]) if pad else chunk
            out, _ = handle.generate(padded, seed=step_seed(runtime.cfg.trainer.seed, 0), validate=True)
            outs.append(out.select(self.spec.outputs).index(range(len(chunk))))
        return NodeResult(outs[0] if len(outs) == 1 else Batch.concat(outs))
