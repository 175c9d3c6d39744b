"""bench/torch_startup.py refuses, before its measured process starts, a model whose host step
would not fit the host (session 30: the Qwen3-8B shape on a 125 GiB host was killed mid-way)."""

from __future__ import annotations

import json
import sys

import pytest
import torch_startup  # noqa: E402  (conftest puts bench/ on the path)

SHAPE_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 12288, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False}  # fmt: skip


def qwen3_config_dir(tmp_path, **fields) -> str:
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rms_norm_eps": 1e-6, **fields}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_8b_host_step_counts_masters_moments_and_pinned_buffers(tmp_path):
    need = torch_startup.host_need_gib(qwen3_config_dir(tmp_path, **SHAPE_8B))
    # 8.19e9 parameters: 12 bytes each of fp32 state (91.5 GiB) + an fp32 gradient and a bf16 staging
    # copy pinned (45.8 GiB); the dry run's host plan for the 8b-torch row says 137.3 for the trainer
    assert 135 < need < 140, need


def test_a_host_too_small_is_refused_before_the_measured_process(tmp_path, monkeypatch, capsys):
    path = qwen3_config_dir(tmp_path, **SHAPE_8B)
    monkeypatch.setattr(torch_startup, "available_gib", lambda: 120.0)
    monkeypatch.setattr(torch_startup.subprocess, "run", lambda *a, **k: pytest.fail("the child started"))
    monkeypatch.setattr(sys, "argv", ["torch_startup.py", "--model", path, "--repeat", "1"])
    with pytest.raises(SystemExit) as info:
        torch_startup.main()
    assert info.value.code == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith("host: the host step's state needs ~13") and "120.0 GiB available" in line
