"""The per-phase memory plan: hand-checked numbers for a small colocated job, the defaults it
chooses, and refusals that name the phase and the keys (dry runs on a machine without a GPU)."""

from __future__ import annotations

import pytest
import torch

from dagrl.backends.megatron.optimizer_host import listed_host_bytes
from dagrl.backends.memory import GIB
from dagrl.backends.model_shape import read_model_shape
from dagrl.backends.pinned import pinned_bytes
from dagrl.backends.vllm.sleep_backup import backup_bytes
from dagrl.errors import ConfigError
from dagrl.trainer.capacity import check_memory
from dagrl.trainer.memory_plan import CONTEXT_BYTES, format_memory_plan
from dagrl.trainer.setup import prepare
from tests.conftest import compose_config
from tests.trainer.conftest import qwen3_dir

A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    return qwen3_dir(tmp_path_factory.mktemp("small"), 64, 2, 4, 2, 16, 128, 1000)


def dry(model: str, *overrides: str):
    return prepare(
        compose_config(
            "trainer.dry_run=true",
            "trainer.device=cuda",
            f"{M}.path={model}",
            f"{A}.optim.lr=1e-6",
            f"{R}.name=vllm",
            *overrides,
        )
    )


# what the small model's engine leaves asleep: its CUDA graphs, 0.02 GiB for each of its 2 layers
ASLEEP = 2 * 0.02 * GIB

SMALL_JOB = (
    f"{M}.dtype=bfloat16",
    "data.train_batch_size=2",
    f"{A}.ppo_mini_batch_size=2",
    f"{R}.n=4",
    f"{A}.ppo_micro_batch_size_per_gpu=4",
    "data.max_prompt_length=16",
    "data.max_response_length=8",
    "trainer.gpu_memory_gib=10",
)


def test_small_colocated_job_by_hand(small):
    # both pinned: auto would skip the old-log-prob pass on-policy and keep this small trainer resident
    # and the engine asleep: auto would keep it awake beside this small trainer (test_engine_residency.py)
    asleep = f"{R}.free_cache_engine=true"
    prepared = dry(small, *SMALL_JOB, f"{A}.recompute_old_logprobs=true", f"{A}.offload=true", asleep)
    [group] = prepared.memory.groups
    rows = {r.phase: r for r in group.rows}
    assert list(rows) == ["rollout", "old_logprob", "update"]
    # parameters: embedding 1000×64 (tied) + 2 layers × (q 64×64, k, v 64×32, o 64×64, q/k norms 16,
    # two norms 64, MLP 3×64×128) + final norm 64
    params = 64_000 + 2 * (4096 + 2048 + 2048 + 4096 + 16 + 16 + 64 + 64 + 24_576) + 64
    assert params == 138_112
    # rollout: vLLM's pool 0.5 × 10 GiB; the trainer offloaded its weights and Adam (its bf16 grads
    # live only from the backward to the step, which upcasts them into the masters' and frees them)
    assert rows["rollout"].parts == {"pool": 5 * GIB}
    assert rows["rollout"].others == {"train": 0}
    assert rows["rollout"].total == 5 * GIB + CONTEXT_BYTES
    # update: bf16 weights 2 B + grads 2 B + fp32 master, m, v 12 B; micro-batch 4 rows × 24 tokens;
    # per token and layer (8 + 4·2)·64 + (4 + 3·2)·(64 + 32) + 4·2·128 = 3008 B, 2 layers;
    # logits + their gradient 2 × 2 B × 4 rows × (8 + 1) positions × 1000
    update = rows["update"].parts
    assert update == {
        "weights": 2 * params,
        "grads": 2 * params,
        "optimizer": 12 * params,
        "activations": 2 * 3008 * 96,
        "logits": 2 * 2 * 4 * 9 * 1000,
    }
    assert rows["update"].others == {"rollout": ASLEEP}  # the engine asleep
    # old log-probs: all 8 rows of the device at once (micro-batch 64), no grad: one layer's
    # tensors at a time (3008 B × 8 rows × 24 tokens), gone before the logits (2 B × 8 × 9 × 1000)
    assert rows["old_logprob"].parts == {
        "weights": 2 * params,
        "optimizer": 12 * params,
        "activations": 3008 * 8 * 24,
    }
    text = format_memory_plan(prepared.memory)
    assert "update" in text and "gradient_checkpointing: auto -> false" in text


def test_token_budget_sets_the_update_workload(small):
    prepared = dry(small, *SMALL_JOB, f"{A}.use_dynamic_bsz=true", f"{A}.ppo_max_token_len_per_gpu=48")
    update = next(r for r in prepared.memory.groups[0].rows if r.phase == "update")
    assert update.parts["activations"] == 2 * 3008 * 48  # 2 whole sequences of 24 tokens


def test_default_vllm_job_at_0_6b_turns_recomputation_on_and_fits(tmp_path):
    """0.6B shape, 64 prompts × 8 × 512 tokens, rollout.name=vllm and nothing else: without
    recomputation the update needs far more than 80 GiB (a CUDA OOM on the card); auto turns it on."""
    model = qwen3_dir(tmp_path, 1024, 28, 16, 8, 128, 3072, 151936)
    prepared = dry(
        model,
        "data.train_batch_size=64",
        f"{A}.ppo_mini_batch_size=64",
        f"{R}.n=8",
        "data.max_response_length=512",
        "data.max_prompt_length=128",
        "trainer.gpu_memory_gib=80",
    )
    assert prepared.cfg.actor_rollout_ref.model.gradient_checkpointing is True
    from dagrl.config.roles import Role

    # the worker's backend reads its spec, decoded before auto was resolved: it must carry the choice
    assert prepared.plan.specs[Role.train].train.gradient_checkpointing is True
    assert prepared.warnings == ()
    assert "gradient_checkpointing: auto -> true" in format_memory_plan(prepared.memory)


def test_4b_torch_recomputed_update_holds_the_logits_or_a_layer_not_both(qwen3_4b):
    """bench/gpu_matrix.py's 4b-torch row (16 prompts x 4 x (160 + 512), the defaults): with
    recomputation the logits and their gradient are freed before the first layer is recomputed.
    Counting both at once planned 49.26 GiB where the H100 held 37.7 (+31 %; docs/perf.md); counting
    every gradient beside them too 42.45 (+12.6 %): one backward makes the gradients while it frees
    the rest, so only the output layer's exists beside the logits (-5.4 %; -4.8 % since the sleeping
    engine's CUDA graphs are counted)."""
    prepared = dry(
        qwen3_4b,
        f"{M}.dtype=bfloat16",
        "data.train_batch_size=16",
        f"{A}.ppo_mini_batch_size=16",
        f"{R}.n=4",
        "data.max_response_length=512",
        "data.max_prompt_length=160",
        "trainer.gpu_memory_gib=79",
    )
    assert prepared.cfg.actor_rollout_ref.model.gradient_checkpointing is True
    [group] = prepared.memory.groups
    update = {r.phase: r for r in group.rows}["update"]
    # one micro-batch of 64 rows x 672 tokens: each of the 36 layers keeps its bf16 input
    # (2 B x 2560); the response's 513 positions' bf16 logits and their gradient over 151,936 words
    # (18.6 GiB) outweigh one recomputed layer (169,984 B a token: 6.8 GiB); of the gradients only
    # the output layer's (bf16, 151,936 x 2560) exists beside them, the rest (7.49 GiB in all, with
    # one recomputed layer at the backward's end: 14.3 GiB) come as they go
    assert update.parts["activations"] == 36 * 2 * 2560 * 64 * 672
    assert update.parts["logits"] == 2 * 2 * 64 * 513 * 151_936
    assert update.parts["grads"] == 2 * 151_936 * 2560
    # with the context and the engine asleep beside it (its CUDA graphs: 36 layers x 0.02 GiB)
    assert update.others == {"rollout": pytest.approx(36 * 0.02 * GIB)}
    assert update.total / GIB == pytest.approx(35.90, abs=0.01)


def test_one_backward_holds_the_output_layers_gradient_beside_the_logits():
    """bench/gpu_matrix.py's 8b-torch row (Qwen3-8B shape, 64 rows x 672 tokens in one micro-batch,
    recomputed, the optimizer on the host): an H200 measured the update's allocator peak 31.65 GiB
    above the weights (2026-11-28) where the plan counted 45.65 (every gradient beside the logits);
    the backward's start counts 31.55. A short sequence peaks at the backward's end instead."""
    from dagrl.backends.memory import Workload
    from dagrl.backends.model_shape import ModelShape
    from dagrl.backends.torch.memory import layer_activation_bytes, one_backward_update

    shape = ModelShape(4096, 36, 32, 8, 128, 12288, 151936, False, 8_190_735_360)
    grads = 2.0 * shape.params
    start = one_backward_update(shape, 2, Workload(64, 672, 512), True, grads)
    assert start == {
        "activations": 36 * 2 * 4096 * 64 * 672,  # each layer's bf16 input
        "logits": 2 * 2 * 64 * 513 * 151_936,  # and their gradient
        "grads": 2 * 151_936 * 4096,  # the output layer's
    }
    assert sum(start.values()) / GIB == pytest.approx(31.55, abs=0.01)
    end = one_backward_update(shape, 2, Workload(1, 32, 16), True, grads)
    assert end == {"grads": grads, "activations": layer_activation_bytes(shape, 2) * 32}
    assert one_backward_update(shape, 2, Workload(1, 32, 16), False, grads) == {
        "grads": grads,
        "activations": 0.0,
    }


def test_the_host_step_counts_what_its_optimizer_allocates_there(small):
    """With the step on the host the torch optimizer keeps, per trained parameter, the fp32
    master, m and v (12 B, pageable), and the pinned buffers the copies cross: the fp32 gradient
    and a staging copy in the model's dtype the rounded weights cross the bus from (2 B in bf16),
    views into power-of-two slabs (backends/pinned.py): the plan's host bytes are those of the real
    optimizer over the same model, its slabs exactly. The plan counted 16 B before: 15.3 GiB short
    at 8B; then one allocation per kind, each rounded up to a power of two (1.5 MiB here)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.backends.pinned import aligned
    from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW

    prepared = dry(small, *SMALL_JOB, f"{A}.optimizer_cpu_offload=true")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(small), dtype=torch.bfloat16)
    opt = MasterWeightsAdamW(
        list(model.parameters()), prepared.cfg.actor_rollout_ref.actor.optim, torch.device("cpu")
    )
    moments = [v for state in opt.state.values() for k, v in state.items() if k != "step"]
    held = {t.data_ptr(): t.nbytes for t in (*opt.masters, *moments)}
    params = sum(p.numel() for p in model.parameters())
    assert sum(held.values()) == 12 * params
    # the buffers the copies cross: views of the slabs, which are all that is allocated for them
    slabs = {s.untyped_storage().data_ptr(): s.numel() for s in opt._slabs}
    assert {t.untyped_storage().data_ptr() for t in (*opt._grads, *opt._staging)} <= set(slabs)
    pinned = sum(slabs.values())
    buffers = sum(aligned(4 * p.numel()) + aligned(2 * p.numel()) for p in model.parameters())
    assert buffers <= pinned < buffers + (1 << 20)  # 0.79 + 0.29 MiB here
    assert prepared.memory.host[0]["train"] == sum(held.values()) + pinned


def test_the_offload_counts_the_slabs_its_host_store_pins(small):
    """actor.offload moves the weights, the fp32 masters and Adam's moments into HostStore's
    slabs: the plan's host bytes are the slabs the store allocates for the real model's storages
    (the exact bytes before: 12 % short of what torch's pinned allocator takes per storage, from
    1.33x at these sizes to 1.41x at 8B)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.backends.host_store import HostStore
    from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW

    prepared = dry(small, *SMALL_JOB, f"{A}.offload=true", f"{A}.optimizer_cpu_offload=false")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(small), dtype=torch.bfloat16)
    opt = MasterWeightsAdamW(list(model.parameters()), prepared.cfg.actor_rollout_ref.actor.optim)
    store = HostStore()
    store.offload([*model.parameters(), *opt.state_tensors()], cpu_too=True)
    params = sum(p.numel() for p in model.parameters())
    assert 14 * params <= store.pinned_bytes < 14 * params + (1 << 20)
    assert prepared.memory.host[0]["train"] == store.pinned_bytes
    store.onload()


def test_accumulated_bucketed_or_upcast_gradients_are_all_there_with_the_logits(small):
    """With the step on the host, one micro-batch on one device: the output layer's gradient only
    beside the logits. Every gradient with two micro-batches a step (the first one's wait through
    the second's backward), DDP (its buckets hold a copy) or the step on the device (it upcasts
    them into the fp32 masters' gradients)."""
    params = 138_112  # test_small_colocated_job_by_hand's
    host = f"{A}.optimizer_cpu_offload=true"

    def update(*overrides):
        prepared = dry(small, *SMALL_JOB, f"{R}.free_cache_engine=true", *overrides)
        return next(r for r in prepared.memory.groups[0].rows if r.phase == "update").parts

    one = f"{A}.ppo_micro_batch_size_per_gpu=8"  # the device's 8 rows at once
    assert update(host, one)["grads"] == 2 * 1000 * 64  # the tied embedding's
    assert update(host)["grads"] == 2 * params  # micro-batches of 4
    assert update(host, "trainer.n_gpus_per_node=2")["grads"] == 2 * params  # 4 rows a device, DDP
    assert update(f"{A}.optimizer_cpu_offload=false", one)["grads"] == 2 * params


# GRPO on megatron with vLLM colocated, 16 prompts x 4 x (128 + 512) tokens: bench/real_size_gpu.py's run
MEGATRON_16X4 = (
    f"{A}.strategy=megatron",
    f"{M}.dtype=bfloat16",
    "data.train_batch_size=16",
    f"{A}.ppo_mini_batch_size=16",
    f"{R}.n=4",
    "data.max_response_length=512",
    "data.max_prompt_length=128",
)


def test_4b_megatron_with_vllm_no_longer_plans_as_fitting(qwen3_4b):
    """Qwen3-4B shape, megatron + vLLM colocated, 16 × 4 × 512 tokens: the old estimate (weights,
    grads, optimizer: 67.4 GiB) printed no warning; the engine's pool beside the resident trainer and
    the update's activations do not fit an 80 GiB card."""
    overrides = (*MEGATRON_16X4, "trainer.gpu_memory_gib=80")
    pinned = f"{A}.megatron.optimizer_cpu_offload"
    # the optimizer pinned on the device, recomputation pinned off, gradient buffers kept: the old
    # estimate's setting
    grads = f"{A}.megatron.grad_offload=false"
    prepared = dry(qwen3_4b, *overrides, f"{pinned}=false", f"{M}.gradient_checkpointing=false", grads)
    assert prepared.plan.memory_gib["train"] == pytest.approx(67.43, abs=0.01)
    [warning] = prepared.warnings
    assert "in phase update" in warning and f"{A}.megatron.recompute_granularity=full" in warning
    over = {r.phase for _, r in prepared.memory.over()}
    assert over == {"rollout", "update"}  # the resident trainer + the pool, too (on-policy: no old_logprob)
    prepared.cfg.trainer.dry_run = False  # a real run: refused before Ray starts
    with pytest.raises(ConfigError, match="in phase update") as info:
        check_memory(prepared.cfg, prepared.memory, prepared.plan)
    assert info.value.key == pinned

    # the defaults (auto): megatron's full recompute, then the optimizer on the host; it fits
    prepared = dry(qwen3_4b, *overrides)
    m = prepared.cfg.actor_rollout_ref.actor.megatron
    assert prepared.warnings == () and m.optimizer_cpu_offload and m.recompute_granularity.value == "full"
    # bf16 weights only while the engine runs: the fp32 gradient buffers (15 GiB) are freed then
    assert prepared.plan.memory_gib["train"] == pytest.approx(7.49, abs=0.01)
    text = format_memory_plan(prepared.memory)
    assert f"{pinned}: auto -> true" in text and f"{M}.gradient_checkpointing: auto -> true" in text


def test_4b_megatron_without_the_distributed_optimizer_keeps_its_optimizer_on_the_device(qwen3_4b):
    """use_distributed_optimizer=false: auto chose megatron's CPU optimizer for the 4B update, which
    megatron-core steps only inside the distributed optimizer (a real run failed at its first step).
    Now the optimizer stays on the device, over the card, and a real run is refused naming the key
    that keeps it there and both keys of the way out."""
    replicated = f"{A}.megatron.use_distributed_optimizer"
    prepared = dry(qwen3_4b, *MEGATRON_16X4, "trainer.gpu_memory_gib=80", f"{replicated}=false")
    assert prepared.cfg.actor_rollout_ref.actor.megatron.optimizer_cpu_offload is False
    assert not prepared.plan.specs["train"].megatron.optimizer_cpu_offload  # what the worker builds
    [warning] = prepared.warnings
    assert "in phase update" in warning
    assert (
        f"the optimizer on the host ({A}.megatron.optimizer_cpu_offload=true with {replicated}=true)"
        in warning
    )
    prepared.cfg.trainer.dry_run = False
    with pytest.raises(ConfigError, match="in phase update") as info:
        check_memory(prepared.cfg, prepared.memory, prepared.plan)
    assert (info.value.key, info.value.value) == (replicated, False)


def test_4b_megatron_recomputed_update_holds_the_logits_or_a_layer_not_both(qwen3_4b):
    """megatron's full recompute, as the torch backend's: the logits over every position and their
    gradient are freed before the first layer is recomputed, so the update's peak is every kept
    input plus the larger of the two. Adding the recomputed layer on top planned the 8b-megatron-lora
    row's update 14 % above what an H200 held with expandable segments (session 21: the allocator's
    peak above the update's start 28.3 GiB, the kept inputs plus logits and gradient 28.1)."""
    prepared = dry(qwen3_4b, *MEGATRON_16X4, "trainer.gpu_memory_gib=141", f"{M}.gradient_checkpointing=true")
    assert prepared.cfg.actor_rollout_ref.actor.megatron.recompute_granularity.value == "full"
    update = {r.phase: r for r in prepared.memory.groups[0].rows}["update"]
    tokens = 64 * 640  # one micro-batch: 16 prompts x 4, 128 + 512 tokens each
    # each of the 36 layers keeps its bf16 input; the bf16 logits over every position and their
    # gradient (23.2 GiB) outweigh one recomputed layer (144,384 B a token: 5.5 GiB)
    assert update.parts["activations"] == 36 * 2 * 2560 * tokens
    assert update.parts["logits"] == 2 * 2 * tokens * 151_936


def test_megatron_recomputed_layer_counts_where_it_outweighs_the_logits(tmp_path):
    """A 100-word vocabulary: one recomputed layer outweighs the logits and their gradient, and the
    update's activations and logits together hold the kept inputs plus that layer."""
    from dagrl.backends.megatron.memory import MegatronLayout, layer_activation_bytes

    model = qwen3_dir(tmp_path, 64, 2, 4, 2, 16, 128, 100)
    prepared = dry(model, *SMALL_JOB, f"{A}.strategy=megatron", f"{M}.gradient_checkpointing=true")
    update = {r.phase: r for r in prepared.memory.groups[0].rows}["update"]
    shape, tokens = read_model_shape(model), 4 * (16 + 8)  # a micro-batch of 4 rows, 16 + 8 tokens
    layer = layer_activation_bytes(shape, 2, MegatronLayout()) * tokens
    assert update.parts["logits"] == 2 * 2 * tokens * 100 < layer
    assert update.parts["activations"] + update.parts["logits"] == 2 * 2 * 64 * tokens + layer


def test_pinned_gradient_checkpointing_off_is_named_when_it_cannot_fit(tmp_path):
    model = qwen3_dir(tmp_path, 1024, 28, 16, 8, 128, 3072, 151936)
    overrides = (
        "data.train_batch_size=64",
        f"{A}.ppo_mini_batch_size=64",
        f"{R}.n=8",
        "data.max_response_length=512",
        "trainer.gpu_memory_gib=80",
    )
    prepared = dry(model, *overrides, f"{M}.gradient_checkpointing=false")
    assert "in phase update" in prepared.warnings[0]
    prepared.cfg.trainer.dry_run = False
    with pytest.raises(ConfigError) as info:
        check_memory(prepared.cfg, prepared.memory, prepared.plan)
    assert info.value.key == f"{M}.gradient_checkpointing" and info.value.value is False


def test_phases_follow_the_dag(small):
    """No old-log-prob pass on-policy (recompute_old_logprobs=false): no such phase in the plan."""
    prepared = dry(small, *SMALL_JOB, f"{A}.recompute_old_logprobs=false")
    assert [r.phase for r in prepared.memory.groups[0].rows] == ["rollout", "update"]


def test_old_logprob_pass_only_where_needed_by_default(small):
    """recompute_old_logprobs=null (auto): on-policy steps take the update's own log-probs; several
    mini-batches or use_kl_in_reward need the separate pass; a pinned true keeps it."""
    phases = lambda *o: [r.phase for r in dry(small, *SMALL_JOB, *o).memory.groups[0].rows]  # noqa: E731
    assert phases() == ["rollout", "update"]
    assert "old_logprob" in phases(f"{A}.ppo_mini_batch_size=1")
    assert "old_logprob" in phases(f"{A}.ppo_epochs=2")
    assert "old_logprob" in phases(f"{A}.recompute_old_logprobs=true")
    assert "old_logprob" in phases("algorithm.use_kl_in_reward=true")


def test_out_of_memory_line_quotes_the_plan(small):
    from dagrl.core.device_faults import CUDA_OOM, DeviceFault, device_error
    from dagrl.trainer.capacity import fault_plan_hint

    prepared = dry(small, *SMALL_JOB)
    fault = DeviceFault(CUDA_OOM, "train", 0, "train_step", "Tried to allocate 2.00 GiB", "traceback")
    error = device_error(fault, prepared.cfg, "node 0")
    error.plan_hint = fault_plan_hint(prepared.memory, prepared.plan, fault)
    line = str(error)
    assert "the memory plan for this phase: planned" in line and "activations" in line
    assert f"{M}.gradient_checkpointing=true" in line.split("the memory plan")[1]
    other = DeviceFault("nccl", "train", 0, "train_step", "timeout", "")
    assert fault_plan_hint(prepared.memory, prepared.plan, other) == ""
    # vLLM's wake failing in the colocated refresh quotes the rollout phase: the pool and what the
    # trainer leaves on the device beside it (asleep between rollouts: the engine must wake)
    asleep = dry(small, *SMALL_JOB, f"{R}.free_cache_engine=true")
    wake = DeviceFault(CUDA_OOM, "train+rollout", 0, "_copy_local", "CUDA Error: out of memory", "")
    hint = fault_plan_hint(asleep.memory, asleep.plan, wake)
    assert hint.startswith("planned") and "rollout: pool" in hint and "train idle" in hint


def test_a_device_where_nothing_is_handed_over_keeps_each_roles_peak(small):
    """The engine awake beside a trainer that offloads nothing: the worker never empties torch's
    cache (core/worker.py: settle), so the rollout phase holds the update's activations and logits
    too (4B torch on an H200: 115.3 GiB in use at both hand-overs, the update planned 105.7, the
    rollout 72.2 before). With the engine asleep the trainer's cache is emptied for the rollout."""
    from dagrl.trainer.memory_plan import describe

    awake = {r.phase: r for r in dry(small, *SMALL_JOB).memory.groups[0].rows}
    assert awake["rollout"].resident and awake["rollout"].total == pytest.approx(awake["update"].total)
    assert "train cached" in describe(awake["rollout"])
    asleep = {r.phase: r for r in dry(small, *SMALL_JOB, f"{R}.free_cache_engine=true").memory.groups[0].rows}
    assert not asleep["rollout"].resident
    assert asleep["rollout"].others["train"] < awake["rollout"].others["train"]  # its state, no cache
    offloads = {r.phase: r for r in dry(small, *SMALL_JOB, f"{A}.offload=true").memory.groups[0].rows}
    assert not offloads["rollout"].resident  # the trainer's offload empties the cache


def test_over_the_card_where_nothing_is_handed_over_names_the_phase_that_makes_the_peak(qwen3_4b):
    """Every phase of such a device carries the same total: the refusal names the update (whose
    own parts make it), not the rollout that comes first."""
    pinned = (f"{R}.free_cache_engine=false", f"{A}.offload=false", f"{M}.gradient_checkpointing=false")
    prepared = dry(
        qwen3_4b,
        *MEGATRON_16X4[1:],
        f"{A}.ppo_micro_batch_size_per_gpu=64",
        "trainer.gpu_memory_gib=80",
        *pinned,
    )
    totals = {r.phase: r.total for _, r in prepared.memory.over()}
    assert len(set(totals.values())) == 1 and {"rollout", "update"} <= totals.keys()
    assert prepared.memory.over()[0][1].phase == "update"


def test_offload_auto_keeps_the_trainer_resident_only_where_it_fits(small):
    """actor.offload=null: resident when every phase fits in 90 % of the card that way; the
    rollout phase then carries the trainer's weights and Adam state besides the engine's pool."""
    roomy = dry(small, *SMALL_JOB)
    assert roomy.cfg.actor_rollout_ref.actor.offload is False
    assert not roomy.plan.specs["train"].offload.params
    rollout = {r.phase: r for r in roomy.memory.groups[0].rows}["rollout"]
    assert rollout.others["train"] > 0 and any("offload: auto -> false" in n for n in roomy.memory.notes)
    # a pool of 0.9 of the card leaves no room for a resident trainer: offloaded as before
    tight = dry(small, *SMALL_JOB, f"{R}.gpu_memory_utilization=0.9")
    assert tight.cfg.actor_rollout_ref.actor.offload is True and tight.plan.specs["train"].offload.params
    pinned = dry(small, *SMALL_JOB, f"{A}.offload=true")
    assert pinned.plan.specs["train"].offload.params and not any(
        "offload: auto" in n for n in pinned.memory.notes
    )


def test_pinned_resident_trainer_is_named_when_the_rollout_cannot_fit(small):
    overrides = (*SMALL_JOB, f"{R}.gpu_memory_utilization=0.95", f"{A}.offload=false")
    prepared = dry(small, *overrides)
    assert "in phase rollout" in prepared.warnings[0]
    prepared.cfg.trainer.dry_run = False
    with pytest.raises(ConfigError) as info:
        check_memory(prepared.cfg, prepared.memory, prepared.plan)
    assert info.value.key == f"{A}.offload" and info.value.value is False


def test_sampling_job_plans_the_sampler_and_the_reward_model(small, tmp_path):
    """pipeline=sample on a GPU: the sampler's pool and the outcome reward model's scoring pass are
    phases of the table (before, the group printed no phase: nothing checked against the card)."""
    from dagrl.backends.memory import GIB

    rm = qwen3_dir(tmp_path / "rm", 64, 2, 4, 2, 16, 128, 1000)
    prepared = dry(
        small,
        "pipeline=sample",
        f"sample.output_dir={tmp_path / 'out'}",
        f"sample.orm_model={rm}",
        "reward.model.micro_batch_size_per_gpu=8",
        "data.max_prompt_length=16",
        "data.max_response_length=8",
        "trainer.gpu_memory_gib=10",
    )
    rows = {r.phase: r for r in prepared.memory.groups[0].rows}
    assert set(rows) == {"rollout", "orm"}, rows
    assert rows["rollout"].role == "sampler" and rows["orm"].role == "orm"
    # the scoring pass by hand (fp32, the default dtype): 8 rows x 24 tokens x 4 bytes x (4 x 64 hidden
    # + 2 x 128 intermediate), 4 bytes a token of scores
    shape_params = rows["orm"].parts["weights"] / 4
    assert rows["orm"].parts["activations"] == 8 * 24 * 4 * (4 * 64 + 2 * 128)
    assert rows["orm"].parts["scores"] == 4 * 8 * 24
    assert shape_params > 0 and rows["orm"].total < 10 * GIB


def test_critic_is_counted_on_the_actor_devices_by_hand(small):
    """algorithm=ppo: the critic (the same small model with a value head, colocated by default)
    has phases of its own and leaves what its offload keeps in everyone else's."""
    prepared = dry(
        small,
        *SMALL_JOB,
        "algorithm=ppo",
        f"{A}.recompute_old_logprobs=true",
        f"{A}.offload=true",
        f"{R}.free_cache_engine=true",
    )
    [group] = prepared.memory.groups
    assert group.roles == ["train", "rollout", "critic"]
    rows = {r.phase: r for r in group.rows}
    assert list(rows) == ["rollout", "old_logprob", "values", "critic_update", "update"]
    params = 138_112  # as in test_small_colocated_job_by_hand (the output layer counted: tied)
    # values: bf16 weights and its fp32 Adam state on the device, 8 rows × 24 tokens, one layer's
    # 3008 B per token at a time; no logits (a value head has no vocabulary)
    assert rows["values"].parts == {
        "weights": 2 * params,
        "optimizer": 12 * params,
        "activations": 3008 * 8 * 24,
    }
    # critic_update: + bf16 grads; 8 rows (mini-batch 2 prompts × 4) in one micro-batch, 2 layers
    assert rows["critic_update"].parts == {
        "weights": 2 * params,
        "optimizer": 12 * params,
        "grads": 2 * params,
        "activations": 2 * 3008 * 8 * 24,
    }
    assert rows["critic_update"].others == {"train": 0, "rollout": ASLEEP}
    # offloaded with the actor (actor.offload): nothing of the critic stays while others run
    assert rows["update"].others == {"rollout": ASLEEP, "critic": 0}


def test_critic_on_devices_of_its_own(small):
    groups = "placement.colocate_groups=[[train,rollout,ref],[critic]]"
    prepared = dry(small, *SMALL_JOB, "algorithm=ppo", "trainer.n_gpus_per_node=2", groups)
    assert [g.roles for g in prepared.plan.groups] == [["train", "rollout"], ["critic"]]
    critic = prepared.memory.groups[1]
    assert [r.phase for r in critic.rows] == ["values", "critic_update"]


@pytest.mark.parametrize("strategy", ["torch", "megatron"])
def test_the_critics_device_figures_are_named_after_its_plan_rows(small, monkeypatch, strategy):
    """The critic backends report each phase's card (device_memory.phase_metrics) under the phase
    names its estimates give the plan's rows (backends/memory.py), so a run's figure sits beside the
    plan's (bench/gpu_matrix.py reads `<phase>/device_memory_used_gib` for every planned phase);
    the critic's renaming of the update loop's figures (actor/ -> critic/) leaves them alone."""
    from dagrl.backends import device_memory
    from dagrl.backends.memory import CRITIC_UPDATE_PHASE, VALUES_PHASE
    from dagrl.objectives.value import critic_metric_names
    from tests.backends.test_device_memory import FakeCuda

    groups = "placement.colocate_groups=[[train,rollout,ref],[critic]]"
    prepared = dry(
        small, *SMALL_JOB, "algorithm=ppo", "trainer.n_gpus_per_node=2", groups, f"critic.strategy={strategy}"
    )
    planned = [r.phase for r in prepared.memory.groups[1].rows]
    assert planned == [VALUES_PHASE, CRITIC_UPDATE_PHASE]
    FakeCuda().install(monkeypatch)  # no GPU here: the figures' names, not their values
    for phase in planned:
        logged = critic_metric_names(device_memory.phase_metrics(phase, device_memory.phase_start()))
        assert {f"{phase}/device_memory_used_gib", f"{phase}/peak_added_gib"} <= set(logged)


def test_critic_phase_over_the_card_names_its_own_levers(small):
    from dagrl.trainer.capacity import phase_levers

    prepared = dry(small, *SMALL_JOB, "algorithm=ppo")
    rows = {r.phase: r for r in prepared.memory.groups[0].rows}
    assert "critic.forward_micro_batch_size_per_gpu" in phase_levers(prepared.plan, rows["values"])
    assert "critic.ppo_micro_batch_size_per_gpu" in phase_levers(prepared.plan, rows["critic_update"])


def test_megatron_critic_is_counted_by_hand(small):
    """critic.strategy=megatron beside the megatron actor: the trunk without a vocabulary layer (the
    small model's is tied: nothing to take off) plus the [64, 1] head and its bias, bf16 weights,
    fp32 grads, fp32 master + Adam; megatron's per-token layer bytes, no logits."""
    prepared = dry(
        small,
        *SMALL_JOB,
        "algorithm=ppo",
        f"{A}.strategy=megatron",
        "critic.strategy=megatron",
        f"{R}.free_cache_engine=true",  # the engine asleep, as counted below
    )
    rows = {r.phase: r for r in prepared.memory.groups[0].rows}
    params = 138_112 + 64 + 1
    # per token and layer (megatron/memory.py): 2 B × (2q + 3kv + (q + kv) + q + 4i + 2h) with
    # q = 64, kv = 32, i = 128, h = 64, plus the norms' inputs and dropout masks 2·2h + 2h
    layer = 2 * (128 + 96 + 96 + 64 + 512 + 128) + (4 * 64 + 2 * 64)
    state = {"weights": 2 * params, "grads": 4 * params, "optimizer": 12 * params}
    assert rows["values"].parts == state | {"activations": layer * 8 * 24}
    assert rows["critic_update"].parts == state | {"activations": 2 * layer * 8 * 24}
    # grad_offload (on unless pinned false) frees its gradient buffers while the others run
    assert rows["update"].others["critic"] == 14 * params
    from dagrl.trainer.capacity import phase_levers

    assert "critic.megatron.tensor_model_parallel_size" in phase_levers(prepared.plan, rows["critic_update"])
    assert "critic.megatron.param_offload" in phase_levers(prepared.plan, rows["update"])
    # host: what its offload copies there (the weights), not the freed gradient buffers
    assert prepared.memory.host[0].get("critic", 0) == 0
    offloaded = dry(
        small,
        *SMALL_JOB,
        "algorithm=ppo",
        f"{A}.strategy=megatron",
        "critic.strategy=megatron",
        "critic.megatron.param_offload=true",
    )
    # the weights in HostStore's pinned slabs: their bytes bounded by an alignment and a bucket's
    # padding per tensor (72 here, 768 B each), in one last slab of a power of two below 1 MiB
    assert offloaded.memory.host[0]["critic"] == pinned_bytes([2 * params + 72 * 768], split=True)
    assert 2 * params < offloaded.memory.host[0]["critic"] < 2 * params + (1 << 20)


def test_megatron_critic_checkpoint_counts_its_own_dtype():
    """Preflight's disk figure for the critic's checkpoint reads critic.megatron.param_dtype, not
    the actor's: fp32 weights carry no master copy (m, v: 8 bytes per 4)."""
    from dagrl.backends.megatron.memory import checkpoint_size
    from dagrl.config.role_specs import role_spec

    cfg = compose_config("algorithm=ppo", "critic.strategy=megatron", "critic.megatron.param_dtype=float32")
    assert checkpoint_size(cfg, role_spec(cfg, "critic"), None) == (4, 2.0)


def test_8b_megatron_on_a_141_gib_card_splits_the_cpu_optimizer_to_fit_a_128_gb_host(tmp_path):
    """Qwen3-8B shape, megatron + vLLM colocated on an H200 beside a 125 GiB host: the CPU
    optimizer (fp32 master, m, v and the pinned gradients, 135 GiB: optimizer_host.py) and the
    sleeping engine's weights do not fit the host, so auto keeps part of the optimizer on the card: the
    smallest share on the host (0.6) whose phases stay within 90 % of the card. Before, the plan
    refused 8B there, and counted the freed gradient buffers as host bytes."""
    model = qwen3_dir(tmp_path / "q8b", 4096, 36, 32, 8, 128, 12288, 151936)
    overrides = (*MEGATRON_16X4, "trainer.gpu_memory_gib=139.8", "trainer.host_memory_gib=125")
    prepared = dry(model, *overrides)
    m = prepared.cfg.actor_rollout_ref.actor.megatron
    share = m.optimizer_offload_fraction
    assert prepared.warnings == () and m.optimizer_cpu_offload and share == 0.55
    assert prepared.plan.specs["train"].megatron.optimizer_offload_fraction == share  # what the worker builds
    params = read_model_shape(model).params
    host = prepared.memory.host[0]
    # the CPU optimizer's tensors of that share on the host (69.44 GiB: 16 B a parameter read
    # 62.03), nothing for the freed gradient buffers; beside them the sleeping engine's pinned copy
    # of its bf16 weights and sampler tables (19.97 GiB for these 14.10 GiB of weights at the
    # H200's max_num_seqs: sleep_backup.py)
    assert host["train"] == sum(listed_host_bytes(read_model_shape(model), 2, 1, 1, 1, share, True))
    assert host["train"] / GIB == pytest.approx(69.44, abs=0.005) and 16 * share * params / GIB < 62.1
    assert host["rollout"] == backup_bytes(read_model_shape(model), 2, 1, 1024)[1]
    assert prepared.memory.peak() <= 0.9 * 139.8 * GIB
    assert f"optimizer_offload_fraction: auto -> {share}" in format_memory_plan(prepared.memory)
    # the engine's residency left to auto: asleep at 0.5, as counted here (test_engine_residency.py)
    r = prepared.cfg.actor_rollout_ref.rollout
    assert (r.free_cache_engine, r.gpu_memory_utilization) == (True, 0.5)
    # the smallest such share: 0.05 less keeps more on the card than 90 % of it
    cpu = f"{A}.megatron.optimizer_cpu_offload=true"  # a pinned share needs the CPU optimizer pinned
    less = dry(model, *overrides, cpu, f"{A}.megatron.optimizer_offload_fraction={share - 0.05:.2f}")
    assert less.memory.peak() > 0.9 * 139.8 * GIB

    # a host with room: all of it on the host, as before
    roomy = dry(model, *overrides, "trainer.host_memory_gib=500")
    assert roomy.cfg.actor_rollout_ref.actor.megatron.optimizer_offload_fraction == 1.0
    # pinned at 1.0: refused for the host, naming the share as a lever
    [warning] = dry(model, *overrides, cpu, f"{A}.megatron.optimizer_offload_fraction=1.0").warnings
    assert "host memory" in warning and "optimizer_offload_fraction" in warning


def test_separate_sync_buffers_are_counted_on_both_sides(small, qwen3_4b):
    """The direct sync's two buckets per side (backends/weight_pipeline.py): kept by the engine's
    device in every phase, made on the trainer's in the weight_sync phase; no more than the model."""
    separate = ("placement=separate", "trainer.n_gpus_per_node=2")
    model_bytes = 138_112 * 2  # the small model in bf16 (test_small_colocated_job_by_hand)
    train, rollout = dry(small, *SMALL_JOB, *separate).memory.groups
    rows = {r.phase: r for r in rollout.rows}
    assert rows["rollout"].parts["sync_buffers"] == 2 * model_bytes
    assert {r.phase: r for r in train.rows}["weight_sync"].parts["sync_buffers"] == 2 * model_bytes
    # a model larger than a bucket: two buckets of rollout.weight_sync_bucket_mb
    prepared = dry(qwen3_4b, *SMALL_JOB, *separate, f"{R}.weight_sync_bucket_mb=128")
    train, rollout = prepared.memory.groups
    assert {r.phase: r for r in rollout.rows}["rollout"].parts["sync_buffers"] == 2 * 128 * 2**20
    assert {r.phase: r for r in train.rows}["weight_sync"].parts["sync_buffers"] == 2 * 128 * 2**20
    assert prepared.plan.memory_gib["rollout"] * GIB >= 2 * 128 * 2**20  # what it keeps between syncs
    colocated = dry(small, *SMALL_JOB).memory.groups[0].rows
    assert all("sync_buffers" not in r.parts for r in colocated)  # an in-process copy


def test_each_pipeline_stage_is_planned_and_the_phase_holds_the_largest(small):
    """megatron at PP=2 on two GPUs: the update's row is its larger stage's (the last here: its
    logits over a 1,000-word vocabulary outweigh the first stage's second micro-batch in flight),
    and the table prints every stage's total beside it; one GPU prints no stages."""
    from dagrl.backends.memory import GIB
    from dagrl.trainer.memory_plan import format_memory_plan

    megatron = (*SMALL_JOB, f"{A}.strategy=megatron")
    prepared = dry(
        small, *megatron, "trainer.n_gpus_per_node=2", f"{A}.megatron.pipeline_model_parallel_size=2"
    )
    update = {r.phase: r for r in prepared.memory.groups[0].rows}["update"]
    first, last = update.stages
    assert update.total == last > first
    # both end stages hold the tied vocabulary matrix and share the rest of the row (the engine's
    # idle share, the context): the first keeps two micro-batches' activations, the last one and
    # the logits with their gradient (a micro-batch of 4 rows of 16 + 8 tokens, bf16)
    assert update.parts["logits"] == 2 * 2 * 4 * 24 * 1000
    assert last - first == pytest.approx(update.parts["logits"] - update.parts["activations"])
    text = format_memory_plan(prepared.memory)
    assert f"train's pipeline stages, first to last: {first / GIB:.2f}, {last / GIB:.2f}" in text
    one_gpu = dry(small, *megatron)
    assert "pipeline stages" not in format_memory_plan(one_gpu.memory)


@pytest.mark.parametrize("strategy", ["torch", "megatron"])
def test_the_teacher_pass_holds_a_layer_or_a_chunk_of_logits_never_the_whole(small, qwen3_4b, strategy):
    # the teacher's top-K pass runs its output layer a chunk of tokens at a time (its allocator peak
    # on an H200 was one layer's MLP: 0.85 GiB for a 1.7B teacher, where the whole logits planned 4.65)
    def teacher_row(model: str, *extra: str):
        prepared = dry(  # the student as the teacher: distillation needs one vocabulary
            model, *SMALL_JOB, "algorithm=gkd", f"teacher.model={model}", f"{A}.strategy={strategy}", *extra
        )
        [group] = prepared.memory.groups
        return next(r for r in group.rows if r.phase == "teacher").parts

    # the small teacher: 8 rows × 24 tokens (8 scored); the chunk holds all 64 response positions,
    # their logits in bf16 beside three fp32 copies (14 B × 1000 words), with the final hidden states
    # (2 B × 64 × 192 tokens): more than a layer's MLP and residual (2 B × 192 × (3·128 + 2·64))
    parts = teacher_row(small)
    assert parts["logits"] == 2 * 64 * 192 + 64 * 1000 * 14
    assert "activations" not in parts
    # a 4B-shape teacher on 2 rows × 24 tokens: 16 scored positions' logits (14 B × 151,936 words
    # each: 34 MB) outweigh a layer's transients (2 B × 48 tokens × (3·9728 + 2·2560): 3.3 MB)
    parts = teacher_row(qwen3_4b, "teacher.log_prob_micro_batch_size_per_gpu=2")
    assert parts["logits"] == 2 * 48 * 2560 + 16 * 151_936 * 14
    # a whole micro-batch of 64 rows of 2,048 + 512 tokens: the layer's transients (the chunk is 110
    # tokens), not every tensor a layer saves for a backward (a log-prob pass's count: 169,984 B a token)
    long = ("data.max_prompt_length=2048", "data.max_response_length=512", "data.train_batch_size=16")
    long += ("trainer.gpu_memory_gib=140",)
    parts = teacher_row(qwen3_4b, *long)
    tokens = 64 * 2560
    assert parts == {"weights": parts["weights"], "activations": 2 * tokens * (3 * 9728 + 2 * 2560)}
    assert parts["activations"] < 169_984 * tokens


MEGATRON_TP2 = (
    f"{A}.strategy=megatron",
    "trainer.n_gpus_per_node=2",
    f"{A}.megatron.tensor_model_parallel_size=2",
    f"{A}.megatron.sequence_parallel=true",
    f"{R}.tensor_model_parallel_size=2",
)


def test_a_tp2_megatron_layout_counts_each_processes_nccl_communicators(small):
    """Megatron TP2 + SP beside vLLM at TP2 on two GPUs (the 2g-0.6b-megatron-tp2-sp row's layout):
    each process holds NCCL's communicators outside torch's allocator (backends/communicators.py),
    the same in every phase: the default group's (the optimizer's build), megatron's data-parallel
    group of one rank, its gradient norm's and TP groups, vLLM's own TP group. That row read
    +3.9 / +4.2 GiB over a plan that counted none (docs/gpu_acceptance.md, session 24)."""
    from dagrl.backends.communicators import FIRST_EXTRA_BYTES, GROUP_BYTES, ONE_RANK_BYTES

    prepared = dry(small, *SMALL_JOB, *MEGATRON_TP2)
    [group] = prepared.memory.groups
    assert group.communicators == {
        "world": GROUP_BYTES,
        "megatron dp": ONE_RANK_BYTES,
        "megatron grad norm": GROUP_BYTES,
        "megatron tp": GROUP_BYTES,
        "vllm tp": GROUP_BYTES,
    }
    # the first communicator's 0.82 GiB, three more of two ranks at 0.47, one of one rank at 0.38
    nccl = FIRST_EXTRA_BYTES + 4 * GROUP_BYTES + ONE_RANK_BYTES
    assert nccl / GIB == pytest.approx(2.61)
    assert {r.phase for r in group.rows} >= {"rollout", "update"}
    for row in group.rows:
        assert row.nccl == nccl
        others = sum(row.others.values())
        assert row.total == pytest.approx(CONTEXT_BYTES + nccl + sum(row.parts.values()) + others)
    text = format_memory_plan(prepared.memory)
    assert "; context 1.00; nccl 2.61" in text
    assert (
        "nccl: 2.61 in each process, its communicators world, megatron dp, megatron grad norm, megatron tp"
        in text
    )


def test_one_gpu_counts_no_communicator(small):
    """On one GPU every group is of one rank: CONTEXT_BYTES holds them, as the one-GPU rows
    measured, and the table reads as it did before communicators were counted."""
    prepared = dry(small, *SMALL_JOB, f"{A}.strategy=megatron")
    [group] = prepared.memory.groups
    assert group.communicators == {}
    for row in group.rows:
        assert row.nccl == 0.0
        others = sum(row.others.values())
        assert row.total == pytest.approx(CONTEXT_BYTES + sum(row.parts.values()) + others)
    assert "nccl" not in format_memory_plan(prepared.memory)


@pytest.mark.parametrize(
    "layout, made",
    [
        # the stages' sends and receives, the export's collectives, the tied embedding's group
        (
            (f"{A}.strategy=megatron", f"{A}.megatron.pipeline_model_parallel_size=2"),
            {
                "world",
                "megatron dp",
                "megatron grad norm",
                "megatron pp send/recv",
                "megatron pp",
                "megatron embedding",
            },
        ),
        # DDP's default group; the reference (forward only, torch) talks over none of its own
        ((f"{A}.use_kl_loss=true",), {"world"}),
        # the engine at TP2 beside a torch trainer
        ((f"{R}.tensor_model_parallel_size=2",), {"world", "vllm tp"}),
    ],
)
def test_two_gpu_layouts_name_the_communicators_their_processes_make(small, layout, made):
    prepared = dry(small, *SMALL_JOB, "trainer.n_gpus_per_node=2", *layout)
    [group] = prepared.memory.groups
    assert set(group.communicators) == made


def test_separate_pools_count_the_weight_sync_group_on_both_sides(small):
    """The trainer's rank 0 and every engine worker join the sync's own broadcast group
    (backends/weight_broadcast.py): its communicator is the only one of a one-GPU trainer and
    engine, the first of each process (0.82 GiB); a DDP trainer on two GPUs adds the default group's."""
    from dagrl.backends.communicators import FIRST_EXTRA_BYTES, GROUP_BYTES

    train, rollout = dry(small, *SMALL_JOB, "placement=separate", "trainer.n_gpus_per_node=2").memory.groups
    for group in (train, rollout):
        assert group.communicators == {"weight sync": GROUP_BYTES}
        assert {r.nccl for r in group.rows} == {FIRST_EXTRA_BYTES + GROUP_BYTES}
    two = (
        "placement=separate",
        "placement.gpus.train=2",
        "placement.gpus.rollout=1",
        "trainer.n_gpus_per_node=3",
    )
    train, rollout = dry(small, *SMALL_JOB, *two).memory.groups
    assert set(train.communicators) == {"world", "weight sync"} and set(rollout.communicators) == {
        "weight sync"
    }
