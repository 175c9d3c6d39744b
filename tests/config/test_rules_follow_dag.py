"""Rules follow the DAG: a part's rule runs when the DAG has its node, whatever the algorithm is
called; and every name the config gives a part is checked against the registries."""

from __future__ import annotations

import pytest

from dagrl.config.validate import check_names
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config

STANDALONE = "experiment=gkd/rollout_colocate_teacher_standalone"
TOPK = "algorithm.gkd.gkd_logits_topk"


def dry(*overrides: str):
    return prepare(compose_config(*overrides, "trainer.dry_run=true"))


@pytest.mark.parametrize("algorithm", ["gkd", "opsd"])
def test_distillation_with_one_response_per_prompt_is_accepted(algorithm):
    # no advantage node runs under GKD/OPSD, so GRPO's group rule (rollout.n >= 2) does not apply
    prepared = dry(f"algorithm={algorithm}", "actor_rollout_ref.rollout.n=1")
    assert "advantage" not in {node.kind for node in prepared.dag.nodes}


def test_grpo_with_one_response_per_prompt_is_refused():
    with pytest.raises(ConfigError) as exc:
        dry("actor_rollout_ref.rollout.n=1")
    assert exc.value.key == "actor_rollout_ref.rollout.n"


@pytest.mark.parametrize(
    "overrides, key",
    [
        ([f"{TOPK}=null"], TOPK),  # full vocabulary from vLLM: the teacher_hidden node's rule
        ([f"{TOPK}=100"], "teacher.engine_kwargs.max_logprobs"),  # the teacher_logprob node's rule
    ],
)
def test_opsd_with_a_standalone_teacher_checks_the_teacher_before_ray(overrides, key):
    # used to be skipped for opsd (the rule asked for algorithm.name == gkd) and hit an assert
    # in the workers after Ray had started
    with pytest.raises(ConfigError) as exc:
        dry(STANDALONE, "algorithm.name=opsd", "dag=opsd", "data.train_files=null", *overrides)
    assert exc.value.key == key


@pytest.mark.parametrize(
    "override, key, near",
    [
        ("algorithm.name=gdk", "algorithm.name", "gkd"),
        ("algorithm.adv_estimator=grp", "algorithm.adv_estimator", "grpo"),
        ("actor_rollout_ref.actor.strategy=megatorn", "actor_rollout_ref.actor.strategy", "megatron"),
        ("actor_rollout_ref.rollout.name=vlm", "actor_rollout_ref.rollout.name", "vllm"),
    ],
)
def test_unregistered_names_are_refused_with_the_nearest(override, key, near):
    with pytest.raises(ConfigError) as exc:
        check_names(compose_config(override))
    assert exc.value.key == key and f"did you mean {near!r}" in str(exc.value)
    assert "registered:" in str(exc.value)


def test_strategy_override_still_composes():
    cfg = compose_config("actor_rollout_ref.actor.strategy=megatron", "algorithm=gkd")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.algorithm.name == "gkd"
    check_names(cfg)
