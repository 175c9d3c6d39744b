"""LoRA on the megatron backend (backends/megatron/lora.py), on CPU under gloo, fp32, on the
shipped tiny model: the adapted model starts as the base, only the adapters train, the reference
is the base, the merged export is PEFT's merge of the exported adapters, TP2 + sequence parallel
trains the same adapters as TP1; in bf16, the adapters compute in bf16 on fp32 mains and a
checkpoint of the adapters resumes bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.backends.megatron.test_backend import INPUT_KEYS, M, _backend, make_batch, megatron_config
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")

LORA = ("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8")
# k_proj left out: a part of megatron's fused QKV layer takes the adapter (lora.py: row mask)
TARGETS = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PARTIAL = (f"actor_rollout_ref.model.target_modules=[{','.join(TARGETS)}]",)


def _with_old_logprobs(backend, batch):
    from dagrl.core.batch import Batch

    out, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "old_logprobs")
    return batch.union(Batch({"old_logprobs": out["old_logprobs"]})), out["old_logprobs"]


def _adapters(backend) -> dict[str, torch.Tensor]:
    from dagrl.backends.megatron.lora import adapter_tensors

    return {k: v.clone() for k, v in adapter_tensors(backend.adapted, backend.tcfg)}


def _train_once(rank: int, world: int, cfg, batch):
    """Log-probs at init, one update, then what the checks read."""
    backend = _backend(cfg, rank, world)
    trainable = sorted(n for c in backend.chunks for n, p in c.named_parameters() if p.requires_grad)
    # what the optimizer steps (its fp32 main params; DP = 1: whole tensors): the adapters only
    stepped = sum(p.numel() for g in backend.optimizer.param_groups for p in g["params"])
    adapters = sum(p.numel() for a in backend.adapted for p in a.adapter.parameters())
    batch, base = _with_old_logprobs(backend, batch)
    _, metrics = backend.train_step(batch)
    after, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "old_logprobs")
    ref, _ = backend.forward_logprobs(batch.select(INPUT_KEYS), "ref_logprobs")
    merged = {k: v.clone() for bucket in backend.export_weights(to_cpu=True) for k, v in bucket.items()}
    return {
        "trainable": trainable,
        "stepped": (stepped, adapters),
        "base": base,
        "after": after["old_logprobs"],
        "ref": ref["ref_logprobs"],
        "loss": metrics["actor/pg_loss"],
        "adapters": _adapters(backend),
        "merged": merged,
    }


@pytest.fixture(scope="module")
def tp1():
    batch = make_batch()
    return batch, run_distributed(_train_once, 1, megatron_config(*LORA, *PARTIAL), batch)[0]


def test_starts_as_base_trains_adapters_only_and_refers_to_the_base(tp1):
    from transformers import AutoConfig

    from dagrl.backends.hf_model import resolve_model_path
    from dagrl.config.schema import ModelConfig
    from tests.backends.megatron.test_weights import _hf_tensors

    batch, out = tp1
    mask = batch["response_mask"].bool()
    assert out["trainable"] and all(".lora." in n for n in out["trainable"])
    assert not any("k_proj" in k for k in out["adapters"])
    assert out["stepped"][0] == out["stepped"][1]  # no fp32 main copy or Adam state of the base
    layers = AutoConfig.from_pretrained(resolve_model_path(ModelConfig().path)).num_hidden_layers
    assert len(out["trainable"]) == 2 * 4 * layers  # A, B of qkv, proj, fc1, fc2 in every layer
    # B starts at zero: the first forward is the base's; the reference stays the base after the step
    assert torch.equal(out["ref"], out["base"])
    assert not torch.allclose(out["after"][mask], out["base"][mask])
    # the merged export is the HF base plus PEFT's scale·B·A, computed by PEFT from the adapters
    hf = _hf_tensors(resolve_model_path(ModelConfig().path))
    want = _peft_merged(resolve_model_path(ModelConfig().path), out["adapters"])
    assert set(out["merged"]) == set(want) - {"lm_head.weight"}  # tied: HF drops it
    for name, tensor in out["merged"].items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-6, msg=name)
        adapted = name.endswith("proj.weight") and "k_proj" not in name
        assert torch.equal(tensor, hf[name]) != adapted, name  # k's rows of the QKV adapter stayed 0


def _peft_merged(path: str, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The torch backend's merge (PEFT) of the HF model at `path` with these adapters."""
    from transformers import AutoModelForCausalLM

    from dagrl.backends.torch.lora import apply_lora, load_adapter_weights, merged_weights
    from dagrl.config.roles import LoraSettings

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    peft_model = apply_lora(model, LoraSettings(rank=4, alpha=8.0, target_modules=TARGETS))
    load_adapter_weights(peft_model, adapters)
    return {k: v.clone() for k, v in merged_weights(peft_model)}


def test_tp2_sequence_parallel_trains_the_same_adapters(tp1):
    """A and B sharded over two TP ranks (SP on): the same loss and, gathered, the same adapters."""
    batch, want = tp1
    cfg = megatron_config(*LORA, *PARTIAL, f"{M}.tensor_model_parallel_size=2", f"{M}.sequence_parallel=true")
    for got in run_distributed(_train_once, 2, cfg, batch):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert set(got["adapters"]) == set(want["adapters"])
        for name, tensor in got["adapters"].items():
            torch.testing.assert_close(tensor, want["adapters"][name], rtol=0, atol=1e-6, msg=name)


def _branch_work(backend) -> dict:
    """One adapter branch's forward and backward on a bf16 input: the dtypes, its fp32 work, and
    the dtypes the optimizer steps. megatron's DDP accumulates each gradient into the parameter's
    fp32 main_grad (its mixed precision): the one fp32 write the backward may make. (The update
    zeroes the gradient buffers first, so the probe leaves nothing behind.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    adapter = backend.adapted[0].adapter
    main_grads = {p.main_grad.data_ptr() for p in adapter.parameters()}

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.fp32 = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(out, "dtype", None) == torch.float32 and out.data_ptr() not in main_grads:
                self.fp32.append(str(func.overloadpacket))
            return out

    x = torch.randn(4, 2, adapter.A.shape[1], dtype=torch.bfloat16)
    with Recorder() as seen:
        out = adapter(x)
        out.backward(torch.ones_like(out))
    return {
        "dtypes": {p.dtype for a in backend.adapted for p in a.adapter.parameters()},
        "out": out.dtype,
        "fp32": seen.fp32,
        "stepped": {p.dtype for g in backend.optimizer.param_groups for p in g["params"]},
    }


def _resume(rank: int, world: int, cfg, batch, path: str, load: bool):
    """Straight: step, save, step. Resumed: load what straight saved after its first step, step.
    Both first run `_branch_work`."""
    backend = _backend(cfg, rank, world)
    work = _branch_work(backend)
    batch, _ = _with_old_logprobs(backend, batch)
    if load:
        backend.load(path)
    else:
        backend.train_step(batch)
        backend.save(path)
    backend.train_step(batch)
    files = sorted(p.name for p in __import__("pathlib").Path(path).iterdir())
    return _adapters(backend), files, work


def test_bf16_adapters_train_on_fp32_mains_and_resume_bit_identically(tmp_path):
    """param_dtype bf16: the adapters are bf16 and their branch does no fp32 work (fp32 adapters
    cast the input and multiply in fp32); megatron's optimizer steps fp32 mains of them; a
    checkpoint holds the adapters (and their mains) only and resumes bit for bit."""
    import os

    bf16 = (f"{M}.param_dtype=bfloat16", "actor_rollout_ref.model.dtype=bfloat16")
    cfg = megatron_config(*LORA, *bf16, "actor_rollout_ref.model.lora_dropout=0.1")  # the RNG resumes too
    batch, path = make_batch(), str(tmp_path / "ckpt")
    os.makedirs(path)
    ((straight, files, work),) = run_distributed(_resume, 1, cfg, batch, path, False)
    assert work["dtypes"] == {torch.bfloat16} and work["out"] == torch.bfloat16
    assert not work["fp32"], f"fp32 work in the adapter branch: {work['fp32']}"
    assert work["stepped"] == {torch.float32}
    ((resumed, _, _),) = run_distributed(_resume, 1, cfg, batch, path, True)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in files)
    assert size < 1e6, f"{size} bytes: the checkpoint holds more than the adapters"
