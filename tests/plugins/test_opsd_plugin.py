"""The OPSD example: a dataset plugin (a row transform from external_plugins) adds each row's
privileged teacher prompt, and its preset feeds them to the standalone teacher's node."""

from __future__ import annotations

import pytest

from dagrl.backends.hf_model import load_tokenizer, resolve_model_path
from dagrl.core.plugins import load_plugins
from dagrl.data import transforms
from dagrl.data.builtin import generate_rows
from dagrl.data.parquet import PromptDataset
from dagrl.errors import DataError
from dagrl.trainer.loop import collate
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config

PLUGIN = "dagrl.plugins.opsd_reference_prompt"


@pytest.fixture
def plugin(isolated_plugins):
    load_plugins([PLUGIN])  # the transform must not reach other tests' datasets: isolated_plugins


def test_plugin_adds_a_teacher_prompt_with_the_reference(plugin):
    tok = load_tokenizer(resolve_model_path(None))
    rows = generate_rows("train", 4, 1)
    data = PromptDataset.from_rows(rows, tok, max_prompt_length=32, source="test")
    example = data[0]
    text = tok.decode(example.teacher_prompt_ids)
    assert rows[0]["extra_info"]["question"] in text
    assert f"A reference solution:\n{rows[0]['extra_info']['answer']}" in text
    assert len(example.teacher_prompt_ids) > len(example.prompt_ids)
    batch = collate(
        [data[i] for i in range(4)], tok.pad_token_id, 2, 0, ("prompts", "prompt_mask", "teacher_prompts")
    )
    assert (
        batch["teacher_prompts"].shape[0] == 8
        and batch["teacher_prompts"].shape[1] > batch["prompts"].shape[1]
    )


def test_plugin_output_is_validated_like_any_row(plugin):
    @transforms.register_row_transform
    def broken(row):
        return {**row, "teacher_prompt": [{"role": "oracle", "content": "x"}]}

    tok = load_tokenizer(resolve_model_path(None))
    with pytest.raises(DataError, match="teacher_prompt"):
        PromptDataset.from_rows(generate_rows("train", 2, 1), tok, max_prompt_length=32, source="test")


def test_opsd_preset_feeds_teacher_prompts_to_the_standalone_teacher(monkeypatch, tmp_path, isolated_plugins):
    monkeypatch.chdir(tmp_path)  # the preset names its plugin by module: any directory works
    # the preset's lengths are a real model's; the tiny model stands in with 64 positions
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    prepared = prepare(
        compose_config("experiment=gkd/opsd_plugin_teacher_standalone", "trainer.dry_run=true")
    )
    assert {"teacher_prompts", "teacher_prompt_mask"} <= set(prepared.dag.source)
    node = prepared.dag.node("teacher_logprob")
    assert "teacher_prompts" in node.inputs
    assert prepared.plan.group_of("teacher").roles == ["teacher"]
    assert prepared.cfg.teacher.placement.value == "standalone"
