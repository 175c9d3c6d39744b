"""The megatron backend on GPUs (bf16, NCCL, the sdpa layer spec): log-probs against transformers,
offload that frees and restores, TP2 / PP2 against TP1, and PP2's update memory per stage. Run on
the GPU machine:

    python -m pytest -m gpu tests/backends/megatron/test_backend_gpu.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback

import pytest
import torch

from tests.conftest import compose_config
from tests.train_backends import train_backend

pytestmark = pytest.mark.gpu
pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)

M = "actor_rollout_ref.actor.megatron"
# skipped before the one-GPU reference run, not after it (a spawned rank costs ~20 s of start-up)
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _spawn_target(rank, world, port, fn, args, out):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(rank)
        torch.distributed.init_process_group("nccl", rank=rank, world_size=world)
        out.put((rank, fn(rank, world, *args), None))
    except Exception:
        out.put((rank, None, traceback.format_exc()))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_on_gpus(fn, world: int, *args) -> list:
    """fn(rank, world, *args) in `world` fresh processes, one GPU each, NCCL; per-rank results."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    ctx = mp.get_context("spawn")
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    out = ctx.Queue()
    procs = [ctx.Process(target=_spawn_target, args=(r, world, port, fn, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict()
    for _ in procs:
        rank, value, error = out.get(timeout=600)
        assert error is None, f"rank {rank} failed:\n{error}"
        results[rank] = value
    for p in procs:
        p.join()
    return [results[r] for r in range(world)]


def qwen3_model(path: str, layers: int = 4) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from dagrl.data.builtin import tiny_model_path

    cfg = AutoConfig.for_model(
        "qwen3",
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        vocab_size=4096,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        architectures=["Qwen3ForCausalLM"],
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    import shutil

    for f in os.listdir(tiny_model_path()):
        if f.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(tiny_model_path(), f), path)
    return path


def gpu_config(model: str, *overrides: str):
    return compose_config(
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.dtype=bfloat16",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.device=cuda",
        *overrides,
    )


def _batch():
    from tests.backends.megatron.test_backend import make_batch

    return make_batch(rows=16, prompt_len=48, resp_len=80, vocab=4096)


def _megatron_logprobs(rank, world, cfg, batch, offload_check=False):
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cuda", rank))
    )
    dp_rank, dp_size, returns = backend.dp_info()
    out, metrics = backend.forward_logprobs(batch, "ref_logprobs")
    result = {"logprobs": out["ref_logprobs"] if returns else None, "returns": returns, "metrics": metrics}
    if offload_check:
        from dagrl.core.batch import Batch

        old = out["ref_logprobs"]
        advantages = torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
        extra = Batch({"old_logprobs": old, "advantages": advantages * batch["response_mask"]})
        train = batch.select(("prompts", "prompt_mask", "responses", "response_mask")).union(extra)
        backend.train_step(train)  # grads and optimizer state exist from here on
        before, _ = backend.forward_logprobs(batch, "ref_logprobs")
        backend.offload()
        result["freed_gib"] = backend.offload_freed_gib
        result["params"] = sum(p.numel() for p in backend._params())
        backend.onload()
        after, _ = backend.forward_logprobs(batch, "ref_logprobs")
        result["restored_exactly"] = torch.equal(before["ref_logprobs"], after["ref_logprobs"])
        _, metrics = backend.train_step(train)  # the restored optimizer state trains
        result["grad_norm_after"] = metrics["actor/grad_norm"]
    return result


def _update_metrics(rank, world, cfg, batch):
    """One update on the batch: (whether the driver keeps this rank's metrics, the metrics)."""
    from dagrl.backends.megatron.train import MegatronTrainBackend
    from dagrl.core.batch import Batch
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        MegatronTrainBackend, cfg, ParallelContext(rank, world, torch.device("cuda", rank))
    )
    old = torch.zeros(batch["response_mask"].shape)  # any old log-probs: the memory is the question
    _, metrics = backend.train_step(batch.union(Batch({"old_logprobs": old})))
    return backend.dp_info()[2], metrics


def _hf_logprobs(cfg, batch):
    from dagrl.backends.torch.train import TorchTrainBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.core.worker import ParallelContext

    backend = train_backend(
        TorchTrainBackend, cfg, ParallelContext(0, 1, torch.device("cuda", 0)), role_spec(cfg, "ref")
    )
    return backend.forward_logprobs(batch, "ref_logprobs")[0]["ref_logprobs"]


def test_bf16_logprobs_match_transformers(tmp_path):
    model = qwen3_model(str(tmp_path / "m"))
    cfg = gpu_config(model)
    batch = _batch()
    ours = run_on_gpus(_megatron_logprobs, 1, cfg, batch)[0]["logprobs"]
    theirs = _hf_logprobs(gpu_config(model, "actor_rollout_ref.actor.strategy=torch"), batch)
    mask = batch["response_mask"].bool()
    diff = (ours - theirs).abs()[mask]
    assert diff.mean() < 0.02 and diff.max() < 0.25, (diff.mean(), diff.max())


def test_offload_frees_params_grads_optimizer_and_restores(tmp_path):
    model = qwen3_model(str(tmp_path / "m"))
    flags = [f"{M}.param_offload=true", f"{M}.grad_offload=true", f"{M}.optimizer_offload=true"]
    r = run_on_gpus(_megatron_logprobs, 1, gpu_config(model, *flags), _batch(), True)[0]
    # bf16 params (2 B) + fp32 grads (4 B) + fp32 main params and Adam m, v (12 B) per parameter
    expected_gib = r["params"] * 18 / 2**30
    assert r["freed_gib"] >= 0.9 * expected_gib, r
    assert r["restored_exactly"] and r["grad_norm_after"] > 0, r


@two_gpus
@pytest.mark.parametrize("layout", ["tensor_model_parallel_size=2", "pipeline_model_parallel_size=2"])
def test_two_gpu_layouts_match_one_gpu(tmp_path, layout):
    model = qwen3_model(str(tmp_path / "m"))
    batch = _batch()
    one = run_on_gpus(_megatron_logprobs, 1, gpu_config(model), batch)[0]["logprobs"]
    two = [
        r
        for r in run_on_gpus(_megatron_logprobs, 2, gpu_config(model, f"{M}.{layout}"), batch)
        if r["returns"]
    ]
    assert len(two) == 1
    diff = (two[0]["logprobs"] - one).abs()[batch["response_mask"].bool()]
    assert diff.mean() < 0.02 and diff.max() < 0.25, (diff.mean(), diff.max())


@two_gpus
def test_tp2_sequence_parallel_matches_one_gpu(tmp_path):
    model = qwen3_model(str(tmp_path / "m"))
    batch = _batch()
    one = run_on_gpus(_megatron_logprobs, 1, gpu_config(model), batch)[0]["logprobs"]
    cfg = gpu_config(model, f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel=true")
    two = [r for r in run_on_gpus(_megatron_logprobs, 2, cfg, batch) if r["returns"]]
    diff = (two[0]["logprobs"] - one).abs()[batch["response_mask"].bool()]
    assert diff.mean() < 0.02 and diff.max() < 0.25, (diff.mean(), diff.max())


@two_gpus
def test_two_gpu_pp2_update_reports_every_stage_from_the_kept_rank(tmp_path):
    """The driver keeps the last stage's metrics alone: they hold the first stage's card too."""
    model = qwen3_model(str(tmp_path / "m"))
    cfg = gpu_config(model, f"{M}.pipeline_model_parallel_size=2")
    results = run_on_gpus(_update_metrics, 2, cfg, _batch())
    kept = [metrics for returns, metrics in results if returns]
    assert len(kept) == 1
    stages = [kept[0][f"update/stage{k}_device_memory_used_gib"] for k in range(2)]
    assert min(stages) > 0 and kept[0]["update/device_memory_used_gib"] == max(stages)
    gathered = [
        {k: v for k, v in m.items() if k.endswith(("device_memory_used_gib", "peak_added_gib"))}
        for _, m in results
    ]
    assert gathered[0] == gathered[1]  # both ranks of the replica hold the same gathered figures
