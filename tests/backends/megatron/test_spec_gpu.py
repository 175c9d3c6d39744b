"""GPU checks of the sdpa layer spec: bf16 agreement with local, speed, TP2+SP under NCCL.

Run on the GPU machine: `python -m pytest -q -m gpu tests/backends/megatron/test_spec_gpu.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from tests.gpu_runs import free_port, visible_cards

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO_ROOT = Path(__file__).resolve().parents[3]


def _nccl_worker(rank: int, world_size: int, port: int, fn, args: tuple, results) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    try:
        torch.distributed.init_process_group(
            "nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
        )
        payload = ("ok", pickle.dumps(fn(rank, world_size, *args)))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        payload = ("error", traceback.format_exc())
    finally:
        with contextlib.suppress(Exception):
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    results.put((rank, *payload))


def _run_nccl(fn, world_size: int, *args) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` GPUs; return per-rank results (CPU)."""
    port = free_port()
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_nccl_worker, args=(rank, world_size, port, fn, args, results))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    outputs = {}
    for _ in range(world_size):
        rank, status, payload = results.get(timeout=600)
        if status != "ok":
            for proc in procs:
                proc.kill()
            raise RuntimeError(f"rank {rank} failed:\n{payload}")
        outputs[rank] = pickle.loads(payload)
    for proc in procs:
        proc.join(timeout=60)
    return [outputs[rank] for rank in range(world_size)]


def _bf16_logits(rank: int, world_size: int) -> dict:
    """{padded: logits [b, s, V] (fp32, CPU) of the same bf16 weights under the sdpa and local
    specs}, causal and left-padded batches from one process (a spawned rank costs ~20 s)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from dagrl.backends.megatron.spec import get_sdpa_block_spec
    from tests.backends.megatron.test_spec import _batch, _config, _gpt

    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(0)
    config = _config(params_dtype=torch.bfloat16, bf16=True, use_cpu_initialization=False)
    sdpa = _gpt(config, get_sdpa_block_spec(config, qk_layernorm=True)).cuda()
    local_spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    local = _gpt(config, local_spec).cuda()
    local.load_state_dict(sdpa.state_dict(), strict=False)
    out = {}
    for padded in (False, True):
        input_ids, position_ids, _, mask = (t.cuda() for t in _batch(padded))
        with torch.no_grad():
            out_sdpa = sdpa(input_ids, position_ids, mask if padded else None)
            out_local = local(input_ids, position_ids, mask if padded else None)
        out[padded] = {"sdpa": out_sdpa.float().cpu(), "local": out_local.float().cpu()}
    return out


@pytest.fixture(scope="module")
def bf16_logits() -> dict:
    (out,) = _run_nccl(_bf16_logits, 1)
    return out


@pytest.mark.parametrize("padded", [False, True], ids=["causal", "left_padded"])
def test_bf16_sdpa_logits_close_to_local(bf16_logits, padded: bool) -> None:
    out = bf16_logits[padded]
    assert torch.isfinite(out["sdpa"]).all()
    # bf16 activations: both runs round differently, so compare at bf16 resolution.
    torch.testing.assert_close(out["sdpa"], out["local"], rtol=2e-2, atol=2e-2)


def _bench(spec: str) -> dict:
    """bench/mcore_loop.py on one GPU: a ~0.56B Qwen3-shaped model, 8 x 1024 tokens."""
    cmd = [sys.executable, str(REPO_ROOT / "bench" / "mcore_loop.py"), "--spec", spec]
    cmd += ["--layers", "16", "--seq-len", "1024", "--micro-batch", "8", "--steps", "6"]
    # the first card this process was given (physical card 0 may be another test's), a free port
    env = os.environ | {"MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": visible_cards()[0]}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_sdpa_faster_than_local() -> None:
    local, sdpa = _bench("local"), _bench("sdpa")
    print(json.dumps({"local": local, "sdpa": sdpa}))
    assert sdpa["ms_per_step"] < local["ms_per_step"]
    assert sdpa["peak_mem_gib"] < local["peak_mem_gib"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_sequence_parallel_matches_tp1_nccl() -> None:
    from tests.backends.megatron.test_spec import _sdpa_train_step

    (reference,) = _run_nccl(_sdpa_train_step, 1, False, None, "cuda")
    for out in _run_nccl(_sdpa_train_step, 2, True, reference, "cuda"):
        torch.testing.assert_close(out["loss"], reference["loss"], rtol=1e-4, atol=1e-5)
        for name, expected in out["expected"].items():
            torch.testing.assert_close(out["grads"][name], expected, rtol=1e-3, atol=1e-5, msg=name)
