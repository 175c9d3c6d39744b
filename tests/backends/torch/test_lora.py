"""LoRA on the torch backend (backends/torch/lora.py), in process on the shipped tiny model: only
the adapters train, the reference is the base, the merged sync gives the hf rollout the
same greedy output as PEFT's own merge, a checkpoint resumes bit for bit, and save_hf writes a
merged model and an adapter directory that transformers and peft load. The module's fixture runs
in fp32 (COMMON); the bf16 test at the end runs the mixed-precision path: bf16 adapters computed
in bf16, fp32 masters stepped and exported."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dagrl.backends.hf.rollout import HFRolloutBackend
from dagrl.backends.torch import lora as lora_layers
from dagrl.backends.torch.train import TorchTrainBackend
from dagrl.config.role_specs import role_spec
from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch
from dagrl.core.worker import ParallelContext
from tests.backends.test_contract import COMMON, INPUT_KEYS, _batch
from tests.conftest import compose_config
from tests.train_backends import train_backend

CPU = ParallelContext(0, 1, torch.device("cpu"))
LORA = (
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.model.lora_dropout=0.1",  # the RNG matters: a resume must restore it
    "actor_rollout_ref.actor.optim.lr=1e-2",
)


def _config(*extra: str):
    cfg = compose_config(*COMMON, *LORA, *extra)
    resolve_defaults(cfg)
    return cfg


def _adapters(backend) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in lora_layers.adapter_weights(backend.model).items()}


def _train_batch(backend) -> Batch:
    batch = _batch()
    old = backend.forward_logprobs(batch.select(list(INPUT_KEYS)), "old_logprobs")[0]["old_logprobs"]
    return batch.union(Batch({"old_logprobs": old * batch["response_mask"]}))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A LoRA backend: log-probs of the base, one update, the log-probs after it (actor and
    reference), a checkpoint, a second update straight after it; what each test reads."""
    tmp = tmp_path_factory.mktemp("lora")
    cfg = _config()
    backend = train_backend(TorchTrainBackend, cfg, CPU)
    batch = _train_batch(backend)
    inputs = batch.select(list(INPUT_KEYS))
    seen = {"base": backend.forward_logprobs(inputs, "old_logprobs")[0]["old_logprobs"]}
    backend.train_step(batch)
    seen["actor"] = backend.forward_logprobs(inputs, "old_logprobs")[0]["old_logprobs"]
    seen["ref"] = backend.forward_logprobs(inputs, "ref_logprobs")[0]["ref_logprobs"]
    backend.save(str(tmp / "ckpt"))
    backend.train_step(batch)
    seen["straight"] = _adapters(backend)
    return cfg, backend, batch, seen, tmp


def test_only_adapters_train_and_the_reference_is_the_base(trained):
    cfg, backend, batch, seen, _ = trained
    trainable = [n for n, p in backend.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    optimized = [p for group in backend.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in backend.model.parameters() if p.requires_grad}
    # an fp32 model: fp32 adapters, stepped in place (no master copy)
    assert all(p.dtype == torch.float32 for p in optimized) and not backend.optimizer.copies
    assert not torch.equal(seen["actor"], seen["base"]), "the update moved the adapters"
    assert torch.equal(seen["ref"], seen["base"])  # adapter off: the base exactly


def test_merged_sync_gives_the_hf_rollout_what_peft_merges(trained):
    from peft import PeftModel  # noqa: F401  (the peft install the export relies on)

    cfg, backend, batch, _, _ = trained
    buckets = list(backend.export_weights())
    names = {n for b in buckets for n in b}
    assert not any("base_layer" in n or "lora_" in n for n in names)
    rollout = HFRolloutBackend(role_spec(cfg, "rollout"), CPU)
    base_names = set(rollout.model.state_dict())
    assert names == base_names
    rollout.load_weights(buckets)
    synced = {k: v.clone() for k, v in rollout.model.state_dict().items()}
    merged_by_peft = lora_layers.apply_lora(base_model(), role_spec(cfg, "train").lora)
    lora_layers.load_adapter_weights(merged_by_peft, lora_layers.adapter_weights(backend.model))
    reference = merged_by_peft.merge_and_unload()
    prompts = batch.select(["prompts", "prompt_mask"])
    got = rollout._generate(prompts, None, 0.0, 1.0, -1, greedy=True)[0]
    rollout.model = reference  # the same sampler on PEFT's merged model
    want = rollout._generate(prompts, None, 0.0, 1.0, -1, greedy=True)[0]
    assert torch.equal(got, want)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(synced[name], tensor), name


def base_model():
    from dagrl.backends.hf_model import load_causal_lm, resolve_model_path

    return load_causal_lm(resolve_model_path(None), "float32", torch.device("cpu"))


def test_adapter_sync_sends_the_adapters_only(trained):
    cfg = _config(
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.lora_sync=adapter",
    )
    spec = role_spec(cfg, "train")
    assert spec.lora.sync == "adapter" and role_spec(cfg, "rollout").lora.sync == "adapter"
    backend = trained[1]
    backend.lora = spec.lora  # the same model, synced as to a vLLM engine on devices of its own
    try:
        buckets = list(backend.export_weights())
    finally:
        backend.lora = role_spec(trained[0], "train").lora
    assert len(buckets) == 1
    assert set(buckets[0]) == set(lora_layers.adapter_weights(backend.model))
    assert all(n.startswith("base_model.model.") and ".lora_" in n for n in buckets[0])


def test_resume_equals_straight(trained):
    """The step after the checkpoint equals the step after loading it, bit for bit (adapters,
    Adam's moments, the dropout RNG)."""
    cfg, _, batch, seen, tmp = trained
    straight = seen["straight"]
    resumed = train_backend(TorchTrainBackend, cfg, CPU)
    resumed.load(str(tmp / "ckpt"))
    resumed.train_step(batch)
    got = _adapters(resumed)
    assert got.keys() == straight.keys()
    for name in straight:
        assert torch.equal(got[name], straight[name]), name
    files = sorted(p.name for p in (tmp / "ckpt").iterdir())
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files


def test_save_hf_writes_a_merged_model_and_the_adapter(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dagrl.backends.hf_model import resolve_model_path

    _, backend, _, _, tmp = trained
    backend.export_hf(str(tmp / "hf"))
    merged = AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(None), dtype=torch.float32)
    by_peft = PeftModel.from_pretrained(base, tmp / "hf" / "adapter").merge_and_unload().state_dict()
    assert merged.keys() == by_peft.keys()
    for name in merged:
        assert torch.equal(merged[name], by_peft[name]), name
    assert dict(lora_layers.merged_weights(backend.model)).keys() == merged.keys()


class _Recorder(TorchDispatchMode):
    """(op, input dtypes, output) of every aten op run under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        dtypes = tuple(a.dtype for a in args if isinstance(a, torch.Tensor))
        self.ops.append((str(func.overloadpacket), dtypes, out))
        return out


def test_bf16_adapters_compute_in_bf16_and_step_fp32_masters(tmp_path):
    """A bf16 model: adapters bf16 with fp32 masters. An adapted layer's forward and backward cast
    nothing to fp32, run no fp32 matmul and make no fp32 tensor (fp32 adapters cast the input,
    multiply in fp32 and promote the bf16 output to fp32); after a step the adapters are their
    masters rounded, and the export holds the masters. (The step takes made-up gradients: a bf16
    model's forward is slow on CPUs without bf16 units, and the layer's backward is checked here.)"""
    cfg = _config("actor_rollout_ref.model.dtype=bfloat16")
    backend = train_backend(TorchTrainBackend, cfg, CPU)
    frozen = {p.dtype for p in backend.model.parameters() if not p.requires_grad}
    adapters = [p for p in backend.model.parameters() if p.requires_grad]
    assert frozen == {p.dtype for p in adapters} == {torch.bfloat16} and backend.optimizer.copies
    name, layer = next(iter(lora_layers.adapted_layers(backend.model).items()))
    x = torch.randn(2, 8, layer.in_features, dtype=torch.bfloat16, requires_grad=True)
    with _Recorder() as seen:
        out = layer(x)
        out.backward(torch.ones_like(out))
    assert out.dtype == torch.bfloat16 and layer.lora_A[lora_layers.ADAPTER].weight.grad is not None
    fp32 = [(op, d) for op, d, o in seen.ops if getattr(o, "dtype", None) == torch.float32]
    assert not fp32, f"{name}: fp32 work in the adapter's forward and backward: {fp32}"

    _made_up_step(backend, seed=0)
    masters = backend.optimizer.masters_by_param()
    assert all(masters[p].dtype == torch.float32 for p in adapters)
    assert all(torch.equal(p, masters[p].to(p.dtype)) for p in adapters)
    assert any(not torch.equal(masters[p], p.float()) for p in adapters), "masters keep what bf16 rounds"
    backend.export_hf(str(tmp_path))
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved.keys() == lora_layers.adapter_weights(backend.model).keys()
    # each saved tensor is its parameter's master itself (PEFT saves `...lora_A.weight` for the
    # parameter `...lora_A.<adapter>.weight`), not read back through the export's own code
    adapter = f".{lora_layers.ADAPTER}."
    want = {
        n.replace(adapter, "."): masters[p] for n, p in backend.model.named_parameters() if p.requires_grad
    }
    assert saved.keys() == want.keys()
    assert all(saved[k].dtype == torch.float32 and torch.equal(saved[k], want[k]) for k in saved)

    # a checkpoint restores the adapters and their masters: the next step is the same, bit for bit
    backend.save(str(tmp_path / "ckpt"))
    resumed = train_backend(TorchTrainBackend, cfg, CPU)
    resumed.load(str(tmp_path / "ckpt"))
    for b in (backend, resumed):
        _made_up_step(b, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), backend.model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(resumed.optimizer.masters, backend.optimizer.masters))


def _made_up_step(backend, seed: int) -> None:
    """An optimizer step on seeded random gradients of the adapters."""
    g = torch.Generator().manual_seed(seed)
    for p in backend.model.parameters():
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
    backend.optimizer_step()
