"""Reward models as roles: the forward-only backend on the shipped tiny RM, and GRPO's rm role."""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import compose_config


def test_tiny_reward_model_scores_correct_sums_higher():
    """The shipped RM through the role's backend: on held-out problems the right sum outscores a
    near miss of the same problem in most pairs (tools/build_tiny_reward_model.py measures it)."""
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.backends.reward_model import RewardModelBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext
    from dagrl.data.builtin import split_problems, tiny_reward_model_path
    from tools.build_tiny_reward_model import pair_batch

    cfg = compose_config("pipeline=sample", f"sample.orm_model={tiny_reward_model_path()}")
    backend = RewardModelBackend(role_spec(cfg, "orm"), ParallelContext(0, 1, torch.device("cpu")))
    tokenizer = load_tokenizer(tiny_reward_model_path())
    pairs = 128
    p, pm, r, rm = pair_batch(tokenizer, list(split_problems("test")), {}, random.Random(2), pairs)
    batch = Batch({"prompts": p, "prompt_mask": pm, "responses": r, "response_mask": rm})
    scores = backend.score(batch)["rm_scores"]
    assert (scores[:pairs] > scores[pairs:]).float().mean() > 0.6  # 0.70 on 512 pairs at build time
    # the PRM reading: one step per answer here, so its one step score is the ORM's
    ends = (rm.sum(1) - 1)[:, None]
    steps = backend.score_steps(batch.union(Batch({"prm_step_ends": ends})))["prm_step_scores"]
    torch.testing.assert_close(steps[:, 0], scores)


def test_grpo_with_a_reward_model_plans_the_rm_role():
    from dagrl.data.builtin import tiny_reward_model_path
    from dagrl.errors import ConfigError
    from dagrl.trainer.setup import prepare

    # the rm role shares the train/rollout device here; on its own: placement.gpus.rm=1
    on = (
        "reward.model.enable=true",
        "trainer.dry_run=true",
        "placement.colocate_groups=[[train,rollout,ref,rm]]",
    )
    prepared = prepare(compose_config(*on, f"reward.model.path={tiny_reward_model_path()}"))
    assert "rm" in prepared.plan.roles
    assert "rm_scores" in prepared.dag.node("reward").inputs
    assert "rm" not in prepare(compose_config("trainer.dry_run=true")).plan.roles
    with pytest.raises(ConfigError, match="reward.model.path"):
        prepare(compose_config(*on))


def test_reward_model_backend_is_open_by_name():
    """reward.model.backend names any registered reward_model backend (a plugin's too); an unknown
    name is refused under that key with the registered ones."""
    from dagrl.backends.registry import register_backend
    from dagrl.config.roles import Role
    from dagrl.data.builtin import tiny_reward_model_path
    from dagrl.errors import ConfigError
    from dagrl.registry import BACKENDS
    from dagrl.trainer.setup import prepare

    on = (
        "reward.model.enable=true",
        f"reward.model.path={tiny_reward_model_path()}",
        "trainer.dry_run=true",
        "placement.colocate_groups=[[train,rollout,ref,rm]]",
    )
    with pytest.raises(ConfigError) as info:
        prepare(compose_config(*on, "reward.model.backend=hf_rm_server"))
    assert info.value.key == "reward.model.backend" and "registered: hf, hf_judge, vllm_judge" in str(
        info.value
    )
    entries = dict(BACKENDS.entries)
    try:
        register_backend("reward_model", "my_rm")(lambda spec, ctx, objective: None)
        prepared = prepare(compose_config(*on, "reward.model.backend=my_rm"))
        assert prepared.plan.specs[Role.rm].backend == "my_rm"
    finally:
        BACKENDS.entries = entries


def test_reward_model_keys_without_a_reward_model_are_refused():
    """reward.model.* set while reward.model.enable=false would do nothing: refused, naming the key."""
    from dagrl.errors import ConfigError
    from dagrl.trainer.setup import prepare

    for override, key in (
        ("reward.model.backend=my_rm", "reward.model.backend"),
        ("reward.model.path=/x", "reward.model.path"),
    ):
        with pytest.raises(ConfigError, match="reward.model.enable=false") as info:
            prepare(compose_config(override, "trainer.dry_run=true"))
        assert info.value.key == key
