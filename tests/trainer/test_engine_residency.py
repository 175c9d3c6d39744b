"""Whether the vLLM engine stays awake beside its colocated trainer (rollout.free_cache_engine and
gpu_memory_utilization left to auto): the plan's choice at real shapes (config-only Qwen3 shapes,
dry runs on a machine without a GPU), the share it sizes by hand, and the backend's side of it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dagrl.backends.memory import GIB
from dagrl.backends.model_shape import read_model_shape
from dagrl.backends.vllm.memory import ENGINE_OVERHEAD_BYTES, awake_share, kv_bytes_per_token
from dagrl.backends.vllm.rollout import VLLMRolloutBackend
from dagrl.config.roles import Role
from dagrl.trainer.engine_residency import RESIDENT_SHARE, why_asleep
from dagrl.trainer.memory_plan import format_memory_plan
from tests.trainer.conftest import qwen3_dir
from tests.trainer.test_memory_plan import dry

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
# the README's configuration (bench/gpu_matrix.py's 0.6b-32x8x256 row): 32 prompts x 8 x (128 + 256)
README = (
    f"{M}.dtype=bfloat16",
    "data.train_batch_size=32",
    f"{A}.ppo_mini_batch_size=32",
    f"{R}.n=8",
    "data.max_prompt_length=128",
    "data.max_response_length=256",
)
# the matrix's 4B / 8B rows: 16 prompts x 4 x (160 + 512)
LARGE = (
    f"{M}.dtype=bfloat16",
    "data.train_batch_size=16",
    f"{A}.ppo_mini_batch_size=16",
    f"{R}.n=4",
    "data.max_prompt_length=160",
    "data.max_response_length=512",
    "trainer.host_memory_gib=125",
)
H100, H200 = "trainer.gpu_memory_gib=79.2", "trainer.gpu_memory_gib=139.8"  # the 8B rows: test_memory_plan.py


@pytest.fixture(scope="module")
def qwen3_06b(tmp_path_factory) -> str:
    return qwen3_dir(tmp_path_factory.mktemp("q06b"), 1024, 28, 16, 8, 128, 3072, 151936)


def test_awake_share_by_hand(qwen3_06b):
    shape = read_model_shape(qwen3_06b, False)
    # K and V, 28 layers x 8 kv heads x 128 x 2 B: 114,688 B a token (vLLM's log: 614,432 tokens in
    # 65.63 GiB at 1.7B, the same attention shape)
    assert kv_bytes_per_token(shape, 2, 1) == 114_688
    # 256 sequences of 384 tokens (24 blocks of 16 each) x 1.25 + bf16 weights + vLLM's own 2.5 GiB
    need = 256 * 24 * 16 * 114_688 * 1.25 + shape.params * 2 + ENGINE_OVERHEAD_BYTES
    card = 79.2 * GIB
    assert awake_share(shape, 2, 1, 256, 384, card) == math.ceil(100 * need / card) / 100 == 0.22
    # a 385th token takes a 25th block: 256 more blocks of 16 tokens
    more = 256 * 16 * 114_688 * 1.25
    assert awake_share(shape, 2, 1, 256, 385, 10 * need) == math.ceil(100 * (need + more) / (10 * need)) / 100
    assert awake_share(shape, 2, 1, 4096, 2048, card) == 0.5  # more than the sleeping share: capped


@pytest.mark.parametrize("card, share", [(H100, 0.22), (H200, 0.12)])
def test_readme_configuration_keeps_the_engine_awake(qwen3_06b, card, share):
    """Before, the engine slept at 0.5 of the card every step and the run went at 0.62x TRL; the
    `fast` preset (engine and trainer resident) at 0.50-0.58x."""
    prepared = dry(qwen3_06b, *README, card)
    r = prepared.cfg.actor_rollout_ref.rollout
    assert r.free_cache_engine is False and r.gpu_memory_utilization == share
    assert prepared.cfg.actor_rollout_ref.actor.offload is False  # the trainer resident too
    # the workers are built from the specs: the engine's carries the choice (vLLM without sleep mode)
    assert prepared.plan.specs[Role.rollout].rollout.free_cache_engine is False
    [group] = prepared.memory.groups
    rows = {row.phase: row for row in group.rows}
    # awake: its pool, and the sampler's transient for 256 sequences x 151,936 words that torch keeps cached
    assert rows["update"].others[Role.rollout] == share * prepared.memory.card_bytes + 256 * 151_936 * 64
    assert prepared.memory.peak() <= RESIDENT_SHARE * prepared.memory.card_bytes
    text = format_memory_plan(prepared.memory)
    assert f"{R}.free_cache_engine: auto -> false" in text
    assert f"{R}.gpu_memory_utilization: auto -> {share}" in text
    # 80 GiB: the update fits beside the awake engine only recomputed (82.6 GiB planned without)
    assert prepared.cfg.actor_rollout_ref.model.gradient_checkpointing is (card == H100)


def _asleep_as_before(model: str, *overrides: str) -> None:
    """auto chose what the engine pinned asleep at 0.5 gives: the same trainer choices, the same plan."""
    auto = dry(model, *overrides)
    pinned = dry(model, *overrides, f"{R}.free_cache_engine=true", f"{R}.gpu_memory_utilization=0.5")
    r = auto.cfg.actor_rollout_ref.rollout
    assert r.free_cache_engine is True and r.gpu_memory_utilization == 0.5
    assert auto.cfg.actor_rollout_ref == pinned.cfg.actor_rollout_ref
    assert [g.rows for g in auto.memory.groups] == [g.rows for g in pinned.memory.groups]
    assert f"{R}.free_cache_engine: auto -> true" in format_memory_plan(auto.memory)


def test_4b_on_80_gib_stays_asleep_where_the_optimizer_steps_on_the_host(qwen3_4b):
    _asleep_as_before(qwen3_4b, *LARGE, H100)


def test_explicit_values_are_kept(qwen3_06b):
    pinned = dry(qwen3_06b, *README, H100, f"{R}.free_cache_engine=true")
    r = pinned.cfg.actor_rollout_ref.rollout
    assert r.free_cache_engine is True and r.gpu_memory_utilization == 0.5  # asleep: today's share
    share = dry(qwen3_06b, *README, H100, f"{R}.gpu_memory_utilization=0.5")
    r = share.cfg.actor_rollout_ref.rollout
    assert r.gpu_memory_utilization == 0.5 and r.free_cache_engine is False  # the user's share, awake
    both = dry(qwen3_06b, *README, H100, f"{R}.free_cache_engine=true", f"{R}.gpu_memory_utilization=0.4")
    r = both.cfg.actor_rollout_ref.rollout
    assert (r.free_cache_engine, r.gpu_memory_utilization) == (True, 0.4)
    assert "free_cache_engine: auto" not in format_memory_plan(both.memory)
    awake = dry(qwen3_06b, *README, H100, f"{R}.free_cache_engine=false")
    assert awake.cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.22  # only the share was open


def test_where_the_engine_has_its_own_devices_or_runs_episodes_auto_keeps_today(qwen3_06b):
    separate = dry(qwen3_06b, *README, H100, "placement=separate", "trainer.n_gpus_per_node=2")
    r = separate.cfg.actor_rollout_ref.rollout
    assert (r.free_cache_engine, r.gpu_memory_utilization) == (True, 0.5)
    prepared = dry(qwen3_06b, *README, H100)
    cfg, plan = prepared.cfg, prepared.plan
    cfg.actor_rollout_ref.rollout.free_cache_engine = None
    assert why_asleep(cfg, plan) is None
    cfg.actor_rollout_ref.rollout.multi_turn.enable = True
    assert why_asleep(cfg, plan) == "multi-turn episodes"


def test_the_awake_engine_never_sleeps_and_a_refresh_resets_its_prefix_cache():
    """The backend's side (no vLLM here: its engine is recorded): free_cache_engine=false hands the
    device over without sleeping, and new weights drop the KV of cached prefixes computed with the
    old ones; an engine built from a spec no plan resolved (None) sleeps as before."""
    calls: list[str] = []
    llm = SimpleNamespace(
        sleep=lambda level: calls.append("sleep"), reset_prefix_cache=lambda: calls.append("reset")
    )
    awake = SimpleNamespace(
        settings=SimpleNamespace(free_cache_engine=False), asleep=False, llm=llm, memory={}
    )
    assert VLLMRolloutBackend.offload(awake) is False and calls == []
    VLLMRolloutBackend.begin_weight_update(awake)  # nothing to wake
    unresolved = SimpleNamespace(
        settings=SimpleNamespace(free_cache_engine=None, sleep_level=1),
        asleep=False,
        synced=False,
        llm=llm,
        memory={},
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dagrl.backends.vllm.rollout._free_gib", lambda: 1.0)
        VLLMRolloutBackend.finish_weight_update(awake)
        assert VLLMRolloutBackend.offload(unresolved) is True
    assert calls == ["reset", "sleep"]


def test_ms_swift_sleep_level_keeps_its_engine_sleeping():
    """ms-swift sleeps its colocated engine only when sleep_level > 0: its GKD YAML asks for 1, so
    the engine sleeps as its dagrl preset pins (auto would keep it awake at this size)."""
    from tests.config.test_config_file import SWIFT, typed

    cfg = typed("--config", str(SWIFT / "rollout_colocate_teacher_colocate.yaml"))
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is True
    separate = typed("--config", str(SWIFT / "rollout_separate_teacher_colocate.yaml"))
    assert separate.actor_rollout_ref.rollout.free_cache_engine is False  # its own GPUs: never sleeps


def test_the_sampling_pipeline_keeps_today(qwen3_06b):
    """pipeline=sample: the sampler reads the rollout section, beside no trainer: asleep at 0.5."""
    prepared = dry(qwen3_06b, "pipeline=sample", H100)
    r = prepared.cfg.actor_rollout_ref.rollout
    assert Role.sampler in prepared.plan.roles
    assert (r.free_cache_engine, r.gpu_memory_utilization) == (True, 0.5)
