"""The objective and estimator registries, and what each built-in objective declares and computes,
against values worked out by hand in the comments."""

from __future__ import annotations

import math
import re

import pytest
import torch

from dagrl.core.batch import Batch
from dagrl.objectives import (
    TokenOutputs,
    build_objective,
    estimator,
    micro_batch_weights,
    objective_entry,
    register_estimator,
    register_objective,
)
from tests.conftest import compose_config

A = "actor_rollout_ref.actor"
BUILT_IN_OBJECTIVES = ["dapo", "dr_grpo", "gkd", "grpo", "gspo", "opsd", "sft"]
BUILT_IN_ESTIMATORS = ["gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]


def test_every_preset_and_estimator_is_registered():
    import os

    from dagrl.main import CONF_DIR
    from dagrl.registry import ESTIMATORS, OBJECTIVES

    presets = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "algorithm")) if f.endswith(".yaml"))
    expected = ["dapo", "dr_grpo", "gkd", "grpo", "gspo", "opsd", "ppo", "reinforce_plus_plus", "rloo", "sft"]
    assert presets == expected
    assert OBJECTIVES.names() == BUILT_IN_OBJECTIVES
    for preset in presets:  # each preset names a registered objective and estimator
        cfg = compose_config(f"algorithm={preset}")
        assert objective_entry(cfg.algorithm.name).build is not None
        assert estimator(cfg.algorithm.adv_estimator).estimate is not None
    assert ESTIMATORS.names() == BUILT_IN_ESTIMATORS
    assert estimator("grpo").estimate is not None


@pytest.mark.parametrize(
    "key, names", [("algorithm.name", BUILT_IN_OBJECTIVES), ("algorithm.adv_estimator", BUILT_IN_ESTIMATORS)]
)
def test_help_names_every_built_in(key, names):
    """`python -m dagrl.main --help` lists what the key accepts: every built-in of its registry."""
    from dagrl.config.keys import schema_keys

    words = set(re.findall(r"\w+", schema_keys()[key].doc))
    assert [name for name in names if name not in words] == []


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register_objective("grpo")(lambda cfg: None)
    with pytest.raises(ValueError, match="registered twice"):
        register_estimator("grpo", (), lambda cfg: None)(lambda r, b, a: r)


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "gspo"])
def test_preset_selects_its_objective(preset):
    cfg = compose_config(f"algorithm={preset}")
    assert cfg.algorithm.name == preset
    objective_entry(cfg.algorithm.name).validate(cfg)  # the preset satisfies its own rules


def test_declared_keys_follow_the_kl_setting():
    plain = build_objective(compose_config(f"{A}.recompute_old_logprobs=true"))
    assert plain.required_keys == ("response_mask", "old_logprobs", "advantages")
    auto = build_objective(compose_config())  # on-policy by default: the update's own, detached
    assert "old_logprobs" not in auto.required_keys and "old_logprobs" in auto.optional_keys
    assert "rollout_logprobs" in plain.optional_keys  # mismatch metrics when the DAG passes them
    corrected = build_objective(compose_config("algorithm.rollout_correction.rollout_is=token"))
    assert "rollout_logprobs" in corrected.required_keys  # a requested correction cannot fall away
    assert plain.optional_keys == ("rollout_logprobs", "ref_logprobs")
    assert plain.request.entropy and not plain.request.entropy_grad  # entropy reported, no graph
    kl = build_objective(
        compose_config(f"{A}.use_kl_loss=true", f"{A}.entropy_coeff=0.01", f"{A}.recompute_old_logprobs=true")
    )
    assert kl.required_keys[-1] == "ref_logprobs" and kl.optional_keys == ("rollout_logprobs",)
    assert kl.request.entropy_grad
    # on-policy without the old-log-prob pass, and a rollout engine that returns no log-probs
    lean = build_objective(
        compose_config(
            f"{A}.recompute_old_logprobs=false", "actor_rollout_ref.rollout.calculate_log_probs=false"
        )
    )
    assert lean.required_keys == ("response_mask", "advantages")
    assert lean.optional_keys == ("old_logprobs", "rollout_logprobs", "ref_logprobs")


def one_row(old: list[float], adv: float, ref: list[float] | None = None) -> Batch:
    tensors = {
        "response_mask": torch.ones(1, len(old), dtype=torch.long),
        "old_logprobs": torch.tensor([old]),
        "advantages": torch.full((1, len(old)), adv),
    }
    if ref is not None:
        tensors["ref_logprobs"] = torch.tensor([ref])
    return Batch(tensors)


def test_grpo_loss_composes_policy_entropy_and_kl():
    # on-policy (logprobs = old): ratio 1, pg_loss = -mean(A) = -0.5
    # entropy [1, 3] -> token mean 2, weighted by 0.1: -0.2
    # k1 KL with ref = logprobs - 1: d = 1 per token -> 1, weighted by 0.5: +0.5
    # loss = -0.5 - 0.2 + 0.5 = -0.2
    cfg = compose_config(
        f"{A}.entropy_coeff=0.1", f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=0.5", f"{A}.kl_loss_type=k1"
    )
    objective = build_objective(cfg)
    logprobs = torch.tensor([[-1.0, -2.0]])
    out = TokenOutputs(logprobs=logprobs, entropy=torch.tensor([[1.0, 3.0]]))
    loss, metrics = objective.loss(one_row([-1.0, -2.0], 0.5, ref=[-2.0, -3.0]), out)
    assert loss.item() == pytest.approx(-0.2)
    assert float(metrics["actor/pg_loss"]) == pytest.approx(-0.5)
    assert float(metrics["actor/entropy"]) == pytest.approx(2.0)
    assert float(metrics["actor/kl_loss"]) == pytest.approx(1.0)


def test_dr_grpo_loss_divides_by_the_configured_max_length():
    # on-policy, A = 1 on 2 tokens: token sum -2, one row, over data.max_response_length = 8: -0.25
    # (GRPO's token mean would give -1, whatever the response length)
    objective = build_objective(compose_config("algorithm=dr_grpo", "data.max_response_length=8"))
    logprobs = torch.tensor([[-1.0, -2.0]])
    out = TokenOutputs(logprobs=logprobs, entropy=torch.zeros(1, 2))
    loss, _ = objective.loss(one_row([-1.0, -2.0], 1.0), out)
    assert loss.item() == pytest.approx(-0.25)


def test_gspo_loss_uses_the_sequence_ratio():
    # token log-ratios [0.3, -0.1]: s = exp(0.1) = 1.105171, above the preset's 1 + 4e-4; with
    # A = 1 the clipped branch is larger: loss = max(-1.105171, -1.0004) = -1.0004
    objective = build_objective(compose_config("algorithm=gspo"))
    out = TokenOutputs(logprobs=torch.tensor([[0.3, -0.1]]), entropy=torch.zeros(1, 2))
    loss, metrics = objective.loss(one_row([0.0, 0.0], 1.0), out)
    assert loss.item() == pytest.approx(-1.0004)
    assert float(metrics["actor/seq_ratio_mean"]) == pytest.approx(math.exp(0.1))
    assert float(metrics["actor/pg_clipfrac"]) == 1.0


def test_micro_batch_weights_by_token_or_by_row():
    # rows with 3, 1 and 2 valid tokens split into micro-batches [0, 1] and [2]
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    mini = Batch({"response_mask": mask})
    micros = mini.chunks(2)
    assert micro_batch_weights(mini, micros, per_token=True) == pytest.approx([4 / 6, 2 / 6])
    assert micro_batch_weights(mini, micros, per_token=False) == pytest.approx([2 / 3, 1 / 3])
    grpo, gspo = build_objective(compose_config()), build_objective(compose_config("algorithm=gspo"))
    assert grpo.micro_batch_weights(mini, micros) == pytest.approx([4 / 6, 2 / 6])  # token-mean
    assert gspo.micro_batch_weights(mini, micros) == pytest.approx([2 / 3, 1 / 3])  # per response


def test_grpo_estimator_with_and_without_std():
    # group 0: rewards [1, 0] -> +-0.7071 (std-normalised) or +-0.5 (Dr. GRPO: mean only)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    batch = Batch({"group_ids": torch.tensor([0, 0]), "response_mask": torch.ones(2, 2, dtype=torch.long)})
    grpo = estimator("grpo")
    assert grpo.required_keys == ("group_ids",)
    std = grpo.estimate(rewards, batch, compose_config().algorithm)
    no_std = grpo.estimate(rewards, batch, compose_config("algorithm=dr_grpo").algorithm)
    assert std[:, 0].tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], abs=1e-5)
    assert no_std[:, 0].tolist() == pytest.approx([0.5, -0.5])
