"""PPO's critic in the config: it runs exactly with GAE (and only in a DAG that trains it), its
keys and warm-up are refused without it, and its own rules name the key (all before Ray)."""

from __future__ import annotations

import pytest

from dagrl.config.critic_role import critic_update
from dagrl.config.keys import schema_keys
from dagrl.config.role_specs import role_spec
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config


def refused(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        prepare(compose_config(*overrides, "trainer.dry_run=true"))
    return info.value


def test_ppo_preset_runs_gae_with_a_colocated_critic():
    prepared = prepare(compose_config("algorithm=ppo", "trainer.dry_run=true"))
    kinds = [n.kind for n in prepared.dag.nodes]
    assert {"values", "critic_update"} <= set(kinds)
    assert set(prepared.dag.node("advantage").required_inputs) >= {"values", "scores", "response_mask"}
    assert [g.roles for g in prepared.plan.groups] == [["train", "rollout", "critic"]]


def test_critic_defaults_follow_the_actor():
    cfg = compose_config(
        "algorithm=ppo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_epochs=2",
    )
    cfg.actor_rollout_ref.actor.optim.lr = 1e-4
    update = critic_update(cfg)
    assert (update.ppo_mini_batch_size, update.ppo_epochs, update.optim.lr) == (4, 2, 1e-4)
    assert "the critic's (critic.optim.lr) is the actor's" in schema_keys()["critic.optim.lr"].doc  # --help
    spec = role_spec(cfg, "critic")
    assert spec.trains and spec.model.path is None and spec.backend == "torch"


@pytest.mark.parametrize(
    "overrides,key,says",
    [
        (("algorithm.adv_estimator=gae",), "algorithm.adv_estimator", "dag=grpo has none"),
        (("algorithm=ppo", "algorithm.adv_estimator=rloo"), "dag", "adv_estimator=rloo"),
        (("critic.optim.lr=1e-5",), "critic.optim.lr", "no critic runs"),
        (("critic.cliprange_value=0.2",), "critic.cliprange_value", "algorithm=ppo"),
        (("trainer.critic_warmup=2",), "trainer.critic_warmup", "no critic runs"),
        (  # the value head is on one stage
            ("algorithm=ppo", "critic.strategy=megatron", "critic.megatron.pipeline_model_parallel_size=2"),
            "critic.megatron.pipeline_model_parallel_size",
            "not pipelined",
        ),
        (
            ("algorithm=ppo", "critic.megatron.param_offload=true"),
            "critic.megatron.param_offload",
            "strategy=megatron",
        ),
        (  # one process, one set of megatron groups: a colocated critic takes the actor's layout
            (
                "algorithm=ppo",
                "critic.strategy=megatron",
                "actor_rollout_ref.actor.strategy=megatron",
                "trainer.n_gpus_per_node=2",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            ),
            "critic.megatron.tensor_model_parallel_size",
            "colocated with the megatron actor",
        ),
        (("algorithm=ppo", "critic.strategy=torchh"), "critic.strategy", "torch"),
        (("algorithm=ppo", "critic.ppo_mini_batch_size=3"), "critic.ppo_mini_batch_size", "divide"),
        (  # a critic on 2 devices of its own, one response per prompt: mini-batches of 1 do not split
            (
                "algorithm=ppo",
                "actor_rollout_ref.rollout.n=1",
                "critic.ppo_mini_batch_size=1",
                "trainer.n_gpus_per_node=3",
                "placement.colocate_groups=[[train,rollout,ref],[critic]]",
                "placement.gpus.critic=2",
            ),
            "critic.ppo_mini_batch_size",
            "critic's DP = 2",
        ),
        (
            ("algorithm=ppo", "critic.ppo_micro_batch_size_per_gpu=48"),
            "critic.ppo_micro_batch_size_per_gpu",
            "gets 128 responses",
        ),
    ],
)
def test_critic_mistakes_are_refused_naming_the_key(overrides, key, says):
    err = refused(*overrides)
    assert err.key == key and says in str(err), str(err)


def test_warmup_zero_is_verl_default_and_accepted():
    prepare(compose_config("trainer.critic_warmup=0", "trainer.dry_run=true"))


def test_critic_model_path_is_checked_before_ray(tmp_path):
    err = refused("algorithm=ppo", f"critic.model.path={tmp_path / 'missing'}")
    assert err.key == "critic.model.path"


def test_verl_critic_keys_map_or_are_refused_in_one_line():
    from dagrl.main import compose

    cfg = compose(["algorithm=ppo", "critic.model.enable_gradient_checkpointing=true"])
    assert cfg.critic.model.gradient_checkpointing is True
    with pytest.raises(ConfigError, match="offloads with the actor") as info:
        compose(["critic.model.fsdp_config.param_offload=true"])
    assert info.value.key == "critic.model.fsdp_config.param_offload"


def test_verl_megatron_critic_keys_mean_the_same():
    """verl's megatron critic section (critic.megatron.*, its optimizer's CPU-offload overrides) is
    critic.megatron.* here; its spec takes the layout, dtype and offload switches from there."""
    from omegaconf import OmegaConf

    from dagrl.main import compose

    cfg = OmegaConf.to_object(
        compose(
            [
                "algorithm=ppo",
                "critic.strategy=megatron",
                "critic.megatron.tensor_model_parallel_size=2",
                "critic.megatron.param_offload=True",
                "critic.megatron.use_dist_checkpointing=False",
                "critic.optim.override_optimizer_config.optimizer_offload_fraction=0.5",
            ]
        )
    )
    assert cfg.critic.megatron.optimizer_offload_fraction == 0.5
    spec = role_spec(cfg, "critic")
    assert (spec.backend, spec.parallel.tp, spec.megatron.tensor_model_parallel_size) == ("megatron", 2, 2)
    assert spec.offload.params and spec.offload.grads and not spec.offload.optimizer


def test_megatron_critic_checkpointing_is_full_recompute():
    """critic.model.gradient_checkpointing on the megatron critic is megatron's full recompute of
    every layer, as the actor's gradient checkpointing is; explicit recompute_* settings win."""
    from dagrl.backends.megatron.critic_rules import critic_megatron

    on = ("algorithm=ppo", "critic.strategy=megatron", "critic.model.gradient_checkpointing=true")
    m = critic_megatron(role_spec(compose_config(*on), "critic"))
    assert (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == ("full", "uniform", 1)
    m = critic_megatron(
        role_spec(compose_config(*on, "critic.megatron.recompute_granularity=selective"), "critic")
    )
    assert (m.recompute_granularity, m.recompute_method) == ("selective", None)
    assert critic_megatron(role_spec(compose_config(*on[:2]), "critic")).recompute_granularity is None


def test_megatron_critic_model_is_checked_under_the_critics_key(tmp_path):
    """A trunk the megatron backend cannot compute exactly (here a GELU MLP) is refused before Ray
    naming critic.model.path, not the actor's key from inside a worker."""
    import json
    import shutil

    from dagrl.backends.hf_model import resolve_model_path

    model = tmp_path / "gelu"
    shutil.copytree(resolve_model_path(None), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    err = refused("algorithm=ppo", "critic.strategy=megatron", f"critic.model.path={model}")
    assert err.key == "critic.model.path" and "SwiGLU" in str(err), str(err)
