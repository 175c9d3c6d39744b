"""Greedy rollouts: verl's do_sample=false decodes greedily, and a group baseline (an estimator that
compares the responses to a prompt) refuses any greedy setting before Ray starts, unless another
term gives the update a signal."""

from __future__ import annotations

import pytest

from dagrl.algos import logprob_temperature
from dagrl.backends.vllm.engine_args import sampling_kwargs
from dagrl.config.role_specs import role_spec
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config, validated_config

R = "actor_rollout_ref.rollout"
GREEDY = [(f"{R}.temperature=0", f"{R}.temperature", 0.0), (f"{R}.top_k=1", f"{R}.top_k", 1)]
GREEDY.append((f"{R}.do_sample=false", f"{R}.do_sample", False))


def dry(*overrides: str):
    return prepare(compose_config(*overrides, "trainer.dry_run=true"))


@pytest.mark.parametrize(
    "algorithm", ["grpo", "rloo", "dapo", "algorithm.adv_estimator=reinforce_plus_plus_baseline"]
)
@pytest.mark.parametrize("greedy, key, value", GREEDY)
def test_group_baselines_refuse_greedy_rollouts(algorithm, greedy, key, value):
    preset = algorithm if "=" in algorithm else f"algorithm={algorithm}"
    with pytest.raises(ConfigError) as info:
        dry(preset, greedy)
    assert (info.value.key, info.value.value) == (key, value)
    assert (
        "every advantage 0" in info.value.fix
        and "algorithm.adv_estimator=reinforce_plus_plus" in info.value.fix
    )
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
    "signal",
    [
        ["actor_rollout_ref.actor.entropy_coeff=0.01"],  # the entropy bonus has a gradient
        ["experiment=multi_turn/calculator"],  # tool outputs may differ between episodes
        [f"{R}.n=1", "algorithm=reinforce_plus_plus"],  # no group to compare
        ["algorithm=gkd"],  # no advantage node
    ],
)
def test_greedy_rollouts_run_where_something_else_gives_a_signal(signal):
    prepared = dry(*signal, f"{R}.temperature=0")
    assert prepared.cfg.actor_rollout_ref.rollout.temperature == 0


def test_do_sample_true_is_the_default_and_false_decodes_greedily():
    assert compose_config().actor_rollout_ref.rollout.do_sample is True
    sampled = validated_config(f"{R}.do_sample=true", f"{R}.temperature=0.7", f"{R}.name=vllm")
    assert sampling_kwargs(role_spec(sampled, "rollout"), [5], validate=False)["temperature"] == 0.7
    # verl's meaning: greedy whatever temperature says; the trainer scores the tokens as greedy ones
    greedy = validated_config(f"{R}.do_sample=false", f"{R}.temperature=0.7", f"{R}.name=vllm")
    assert greedy.actor_rollout_ref.rollout.temperature == 0.0
    assert sampling_kwargs(role_spec(greedy, "rollout"), [5], validate=False)["temperature"] == 0.0
    assert logprob_temperature(role_spec(greedy, "train").train.temperature) == 1.0
