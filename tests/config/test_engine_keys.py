"""A rollout key only some engines read does nothing under another engine: refused, naming the
engines that read it (each registers its keys: register_backend(..., reads=))."""

from __future__ import annotations

import pytest

from dagrl.errors import ConfigError
from tests.conftest import validated_config

R = "actor_rollout_ref.rollout"


checked = validated_config


@pytest.mark.parametrize(
    "override, key",
    [
        (f"{R}.gpu_memory_utilization=0.3", f"{R}.gpu_memory_utilization"),
        (f"{R}.enforce_eager=true", f"{R}.enforce_eager"),
        (f"{R}.max_num_seqs=64", f"{R}.max_num_seqs"),
        (f"+{R}.engine_kwargs.vllm.kv_cache_dtype=fp8", f"{R}.engine_kwargs.vllm"),
    ],
)
def test_vllm_keys_under_the_hf_rollout_are_refused(override, key):
    with pytest.raises(ConfigError) as info:
        checked(override)  # the default rollout is hf
    assert info.value.key == key
    assert f"only the vllm rollout reads it and {R}.name=hf does not" in str(info.value)


def test_hf_key_under_vllm_is_refused_and_each_engine_keeps_its_own():
    with pytest.raises(ConfigError) as info:
        checked(f"{R}.name=vllm", f"{R}.micro_batch_size_per_gpu=8", "trainer.dry_run=true")
    assert info.value.key == f"{R}.micro_batch_size_per_gpu" and "only the hf rollout" in str(info.value)
    checked(f"{R}.micro_batch_size_per_gpu=8")  # hf reads it
    cfg = checked(f"{R}.name=vllm", f"{R}.gpu_memory_utilization=0.3", "trainer.dry_run=true")
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.3
    checked(f"{R}.gpu_memory_utilization=null")  # the default (auto) is no choice: accepted
