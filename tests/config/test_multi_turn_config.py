"""multi_turn settings: verl's and ms-swift's keys, and the rules checked before Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagrl.config.compat import translate
from dagrl.config.validate import resolve_defaults, validate
from dagrl.errors import ConfigError
from tests.conftest import compose_config

MT = "actor_rollout_ref.rollout.multi_turn"
OK = [
    "dag=grpo_multi_turn",
    f"{MT}.enable=true",
    f"{MT}.tool_config_path=conf/tools/calculator.yaml",
    f"{MT}.max_tool_response_length=16",
    "data.max_response_length=64",
]


def checked(*overrides):
    cfg = compose_config(*translate(list(overrides)))
    resolve_defaults(cfg)
    validate(cfg)
    return cfg


def test_verl_and_ms_swift_keys():
    cfg = checked(*OK, f"{MT}.max_user_turns=2", "max_turns=3", f"{MT}.format=hermes")
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_user_turns) == (True, 3, 2)
    with pytest.raises(ConfigError, match="interaction_config_path"):
        translate([f"{MT}.interaction_config_path=x.yaml"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.max_response_length=20", "data.max_response_length"),
        (f"{MT}.tool_config_path=/nonexistent.yaml", f"{MT}.tool_config_path"),
        (f"{MT}.tool_config_path=null", f"{MT}.tool_config_path"),
        (f"{MT}.format=json", f"{MT}.format"),
        (f"{MT}.environment=gym", f"{MT}.environment"),
        ("actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.rollout.ignore_eos"),
    ],
)
def test_rules_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        checked(*OK, override)
    assert e.value.key == key


def test_ignore_eos_runs_with_a_per_turn_cap():
    """Turns then hand over at the cap (bench/multi_turn_gpu.py's random weights never stop)."""
    checked(*OK, "actor_rollout_ref.rollout.ignore_eos=true", f"{MT}.max_tokens_per_turn=8")


@pytest.mark.parametrize("dag", ["grpo", "gkd", "opsd"])
def test_multi_turn_enable_alone_runs_the_multi_turn_dag(dag):
    """verl's one key turns multi-turn on: the algorithm's DAG follows (it was refused until
    dag=<name>_multi_turn was added, the single-turn DAGs dropping the episodes' masks)."""
    cfg = compose_config(*OK[1:], f"dag={dag}")
    resolve_defaults(cfg)
    assert cfg.dag == f"{dag}_multi_turn"
    assert checked(*OK[1:]).dag == "grpo_multi_turn"  # the default algorithm's, no dag key given


def test_budget_rule_counts_turns_observation_and_template():
    """4 turns + 16 observation tokens + 8 template tokens = 28."""
    checked(*OK, "data.max_response_length=28")
    with pytest.raises(ConfigError, match="need 28"):
        checked(*OK, "data.max_response_length=27")


def test_presets_compose_and_validate():
    from dagrl.data.builtin_calculator import tiny_calculator_path

    cfg = checked("experiment=multi_turn/calculator")
    assert cfg.actor_rollout_ref.model.path == tiny_calculator_path()
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable and cfg.dag == "grpo_multi_turn"
    cfg = checked("experiment=multi_turn/python_math", "actor_rollout_ref.model.path=/models/qwen")
    assert cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == "conf/tools/python.yaml"


@pytest.mark.parametrize("algorithm", ["gkd", "opsd"])
@pytest.mark.parametrize("topk", [None, 8])
def test_distillation_dags_give_the_teacher_the_whole_episode(algorithm, topk):
    """algorithm=gkd|opsd with dag=<it>_multi_turn: the teacher node that runs (top-k or hidden
    states) and the update read response_attention_mask; validation passes."""
    from dagrl.core.dag import build_dag, load_dag_specs, prune_disabled

    k = f"algorithm.gkd.gkd_logits_topk={topk if topk else 'null'}"
    cfg = checked(*OK, f"algorithm={algorithm}", f"dag={algorithm}_multi_turn", k)
    source, specs = load_dag_specs(cfg.dag)
    dag = build_dag(cfg.dag, source, prune_disabled(specs, cfg), {"train", "rollout", "teacher"})
    teacher = dag.node("teacher_logprob" if topk else "teacher_hidden")
    assert "response_attention_mask" in teacher.inputs
    assert "response_attention_mask" in teacher.required_inputs
    assert "response_attention_mask" in dag.node("actor_update").inputs


def test_python_math_preset_plans_a_vllm_run_on_gsm8k(tmp_path, monkeypatch, isolated_plugins):
    """experiment=multi_turn/python_math on gsm8k parquet written by examples/data_preprocess/
    gsm8k.py (the fixture rows, repeated to fill the batch of 64) and a Qwen3-1.7B-shape
    model directory (config only): it composes, its rules pass, and the dry run plans vLLM on one
    GPU with the sandboxed python tool and the Hermes parser."""

    from transformers import Qwen3Config

    from dagrl.config.placement import format_plan
    from dagrl.trainer.setup import prepare
    from tests.data_preprocess.test_scripts import gsm8k_parquet

    gsm8k_parquet(tmp_path)
    model = tmp_path / "qwen3_1p7b"
    Qwen3Config(
        hidden_size=2048,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=True,
    ).save_pretrained(model)

    # the preset's plugin registers a row transform: isolated_plugins keeps it from other tests' datasets
    monkeypatch.chdir(tmp_path)  # the preset names its plugin and tools by module and package file
    prepared = prepare(
        compose_config(
            "experiment=multi_turn/python_math",
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={tmp_path / 'gsm8k' / 'train.parquet'}",
            f"data.val_files={tmp_path / 'gsm8k' / 'test.parquet'}",
            "trainer.dry_run=true",
        )
    )
    cfg, plan = prepared.cfg, prepared.plan
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and plan.device == "cuda" and plan.total_slots == 1
    assert (mt.enable, mt.format) == (True, "hermes")
    assert mt.tool_config_path == str(
        Path(__file__).resolve().parents[2] / "dagrl" / "conf" / "tools" / "python.yaml"
    )  # the package's
    assert cfg.data.train_batch_size == 64 and prepared.dag.name == "grpo_multi_turn"
    text = format_plan(plan)
    assert "vllm" in text and "GiB/device" in text
    row = {"prompt": [{"role": "user", "content": "2+2?"}]}  # the plugin's system message first
    from dagrl.data import transforms

    (shown,) = transforms.apply_row_transforms([row])
    assert shown["prompt"][0]["role"] == "system" and '"python"' in shown["prompt"][0]["content"]
