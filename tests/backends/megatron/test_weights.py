"""HF checkpoints -> megatron GPTModel -> HF: same logits as transformers, bit-exact round trip.

Megatron runs in spawned gloo ranks (tests/megatron_cpu_patch.py); one spawn checks several
models so the ~8 s megatron import is paid once. The transformers reference runs in the parent.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.megatron_cpu_patch import run_distributed

TINY_ARITH = os.path.join(os.path.dirname(__file__), "..", "..", "..", "dagrl", "assets", "tiny_arith")
ATOL = 1e-4
SEQ = 11


# --- tiny HF checkpoints --------------------------------------------------------------------------


def _tiny_hf(tmp_path, arch: str, tied: bool, num_layers: int = 2, norm_topk_prob: bool = True) -> str:
    """A random tiny HF model saved with save_pretrained; norms randomised so a mix-up shows in logits."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    common = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        initializer_range=0.1,
    )
    if arch == "llama":
        config = LlamaConfig(**common, rope_theta=10000.0)
    elif arch == "qwen3":
        config = Qwen3Config(**common, head_dim=32, rope_theta=1e6)  # head_dim != hidden / heads
    else:
        config = Qwen3MoeConfig(
            **common,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=norm_topk_prob,
        )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    out = tmp_path / f"{arch}_{'tied' if tied else 'untied'}_{num_layers}_{norm_topk_prob}"
    model.save_pretrained(out)
    return str(out)


def _hf_logits(hf_dir: str, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


def _hf_tensors(hf_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(hf_dir, "model.safetensors"))


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))


# --- inside the spawned ranks ---------------------------------------------------------------------


def _build(hf_dir: str, m):
    """(hf_config, chunks) with megatron's local layer spec, or dagrl's SDPA block spec for layer_spec=sdpa."""
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from transformers import AutoConfig

    from dagrl.backends.megatron.model import build_model, transformer_config
    from dagrl.config.schema import LayerSpec

    tensor_parallel.model_parallel_cuda_manual_seed(
        0
    )  # attention forks its RNG tracker (CPU under the patch)
    hf_config = AutoConfig.from_pretrained(hf_dir)
    tcfg = transformer_config(hf_config, m, params_dtype=torch.float32, use_cpu_initialization=True)
    if m.layer_spec == LayerSpec.sdpa:
        from dagrl.backends.megatron.spec import get_sdpa_block_spec

        def spec(vp_stage):
            return get_sdpa_block_spec(
                tcfg, num_experts=tcfg.num_moe_experts, qk_layernorm=tcfg.qk_layernorm, vp_stage=vp_stage
            )
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=tcfg.num_moe_experts, qk_layernorm=tcfg.qk_layernorm, normalization="RMSNorm"
        )
    return hf_config, build_model(hf_config, tcfg, spec, vp_size=m.virtual_pipeline_model_parallel_size)


class _FakeStream:
    """Stands in for torch.cuda.Stream/Event: the MoE all-to-all dispatcher syncs device->host copies.

    One instance, so the dispatcher's side stream *is* the current stream and nothing is recorded.
    """

    _instance: _FakeStream | None = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def wait_stream(self, other) -> None:
        pass

    def record_event(self) -> _FakeStream:
        return self

    def synchronize(self) -> None:
        pass


def _patch_moe_for_cpu() -> None:
    """Test-only (spawned ranks): the CPU patch does not cover MoE yet.

    The all-to-all dispatcher makes CUDA streams and leaves its split sizes as tensors when they
    are already on the CPU (gloo wants lists), and megatron-core 0.16.1's router GEMM reads
    `te_general_gemm`, a name only bound when TransformerEngine imports.
    """
    import contextlib

    import torch.distributed as dist
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    all_to_all_single = dist.all_to_all_single

    def all_to_all_with_list_splits(output, input, output_split_sizes=None, input_split_sizes=None, **kw):
        as_list = lambda s: s.tolist() if hasattr(s, "tolist") else s  # noqa: E731
        return all_to_all_single(output, input, as_list(output_split_sizes), as_list(input_split_sizes), **kw)

    dist.all_to_all_single = all_to_all_with_list_splits

    torch.cuda.Stream = _FakeStream  # a class, as transformers annotates with `torch.cuda.Stream | None`
    torch.cuda.current_stream = lambda device=None: _FakeStream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()


def _forward(chunk, ids: torch.Tensor) -> torch.Tensor | None:
    """Full-vocab logits [B, T, V] on the last PP stage (None elsewhere); hidden states sent by hand."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    pos = torch.arange(ids.shape[1]).expand_as(ids)
    # explicit mask (True = hidden): megatron's default causal mask is built on device="cuda"
    causal = torch.triu(torch.ones(1, 1, ids.shape[1], ids.shape[1], dtype=torch.bool), diagonal=1)
    if not ps.is_pipeline_first_stage():
        hidden = torch.empty(ids.shape[1], ids.shape[0], chunk.config.hidden_size)  # [T, B, H]
        dist.recv(hidden, src=ps.get_pipeline_model_parallel_prev_rank())
        chunk.set_input_tensor(hidden)
    with torch.no_grad():
        out = chunk(ids, pos, attention_mask=causal)
    if not ps.is_pipeline_last_stage():
        dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
        return None
    shards = [torch.empty_like(out) for _ in range(ps.get_tensor_model_parallel_world_size())]
    dist.all_gather(shards, out.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(shards, dim=-1)


def _load_run_export(rank: int, world: int, hf_dirs: list[str], parallel: dict, ids: torch.Tensor) -> list:
    """Per model: (logits or None, exported (name, tensor) pairs) of this rank."""
    from megatron.core import parallel_state as ps

    from dagrl.backends.megatron.weights import export_hf_weights, load_hf_weights
    from dagrl.config.schema import MegatronConfig

    m = MegatronConfig(**{"layer_spec": "local", **parallel}, param_dtype="float32")
    _patch_moe_for_cpu()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=m.tensor_model_parallel_size,
        pipeline_model_parallel_size=m.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=m.virtual_pipeline_model_parallel_size,
        expert_model_parallel_size=m.expert_model_parallel_size,
    )
    results = []
    for hf_dir in hf_dirs:
        hf_config, chunks = _build(hf_dir, m)
        load_hf_weights(chunks, hf_dir)
        logits = _forward(chunks[0], ids) if m.virtual_pipeline_model_parallel_size is None else None
        results.append((logits, list(export_hf_weights(chunks, hf_config))))
    return results


def _load_and_save(rank: int, world: int, hf_dir: str, parallel: dict, out_dir: str) -> None:
    from megatron.core import parallel_state as ps

    from dagrl.backends.megatron.weights import load_hf_weights, save_hf
    from dagrl.config.schema import MegatronConfig

    m = MegatronConfig(**{"layer_spec": "local", **parallel}, param_dtype="float32")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=m.tensor_model_parallel_size,
        pipeline_model_parallel_size=m.pipeline_model_parallel_size,
    )
    hf_config, chunks = _build(hf_dir, m)
    load_hf_weights(chunks, hf_dir)
    save_hf(chunks, hf_config, out_dir, tokenizer_dir=hf_dir)


# --- checks ---------------------------------------------------------------------------------------


def _check(hf_dirs: list[str], parallel: dict, world: int, check_logits: bool = True) -> None:
    vocab = 261 if hf_dirs[0] == TINY_ARITH else 128
    ids = _ids(vocab)
    per_rank = run_distributed(_load_run_export, world, hf_dirs, parallel, ids)
    for i, hf_dir in enumerate(hf_dirs):
        expected = _hf_tensors(hf_dir)
        for rank, results in enumerate(per_rank):
            logits, pairs = results[i]
            exported = dict(pairs)
            assert len(exported) == len(pairs), "a name was yielded twice"
            assert set(exported) == set(expected), (hf_dir, rank, set(exported) ^ set(expected))
            for name, tensor in expected.items():
                assert torch.equal(exported[name], tensor), (hf_dir, rank, name)
        if check_logits:
            reference = _hf_logits(hf_dir, ids)
            got = [r[i][0] for r in per_rank if r[i][0] is not None]
            assert got, "no rank returned logits"
            for logits in got:  # columns past the HF vocabulary pad it to a multiple of TP
                torch.testing.assert_close(logits[..., : reference.shape[-1]], reference, atol=ATOL, rtol=0)


def test_single_rank_qwen2_tiny_arith():
    _check([TINY_ARITH], {}, world=1)


def test_single_rank_qwen3_llama_tied_untied(tmp_path):
    dirs = [
        _tiny_hf(tmp_path, "qwen3", tied=False),
        _tiny_hf(tmp_path, "qwen3", tied=True),
        _tiny_hf(tmp_path, "llama", tied=True),
        _tiny_hf(tmp_path, "llama", tied=False),
    ]
    _check(dirs, {}, world=1)


def test_tp2(tmp_path):
    dirs = [_tiny_hf(tmp_path, "qwen3", tied=False), _tiny_hf(tmp_path, "llama", tied=True)]
    _check(dirs, {"tensor_model_parallel_size": 2}, world=2)


def test_pp2(tmp_path):
    dirs = [_tiny_hf(tmp_path, "llama", tied=False, num_layers=4), _tiny_hf(tmp_path, "qwen3", tied=True)]
    _check(dirs, {"pipeline_model_parallel_size": 2}, world=2)


def test_pp2_vpp2_round_trip(tmp_path):
    dirs = [_tiny_hf(tmp_path, "llama", tied=False, num_layers=4)]
    parallel = {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}
    _check(dirs, parallel, world=2, check_logits=False)


def test_ep2_qwen3_moe(tmp_path):
    dirs = [
        _tiny_hf(tmp_path, "qwen3_moe", tied=False, norm_topk_prob=True),
        _tiny_hf(tmp_path, "qwen3_moe", tied=True, norm_topk_prob=False),
    ]
    _check(dirs, {"expert_model_parallel_size": 2}, world=2)


def test_sdpa_spec_tp2_and_pp2_vpp2(tmp_path):
    """dagrl's SDPA block spec (one per VPP stage) names its parameters like the local spec."""
    qwen3 = _tiny_hf(tmp_path, "qwen3", tied=False)
    _check([qwen3], {"tensor_model_parallel_size": 2, "layer_spec": "sdpa"}, world=2)
    llama = _tiny_hf(tmp_path, "llama", tied=True, num_layers=4)
    parallel = {
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
        "layer_spec": "sdpa",
    }
    _check([llama], parallel, world=2, check_logits=False)


def test_save_hf_reloads_in_transformers(tmp_path):
    out = tmp_path / "saved"
    run_distributed(_load_and_save, 2, TINY_ARITH, {"pipeline_model_parallel_size": 2}, str(out))
    saved, expected = _hf_tensors(str(out)), _hf_tensors(TINY_ARITH)
    assert set(saved) == set(expected)
    assert all(torch.equal(saved[k], v) for k, v in expected.items())
    assert os.path.isfile(out / "tokenizer.json") and os.path.isfile(out / "config.json")
    ids = _ids(261)
    torch.testing.assert_close(_hf_logits(str(out), ids), _hf_logits(TINY_ARITH, ids), atol=0, rtol=0)


def test_tp2_pads_an_odd_vocabulary():
    """tiny_arith's 261 tokens become 262 rows (one zero row on TP rank 1); export drops it."""
    _check([TINY_ARITH], {"tensor_model_parallel_size": 2}, world=2)


def test_unsupported_architecture():
    from transformers import GPT2Config, LlamaConfig

    from dagrl.backends.megatron.model import transformer_config
    from dagrl.config.schema import MegatronConfig
    from dagrl.errors import ConfigError

    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
        transformer_config(
            GPT2Config(), MegatronConfig(), params_dtype=torch.float32, use_cpu_initialization=True
        )
    with pytest.raises(ConfigError, match="attention_bias"):
        transformer_config(
            LlamaConfig(attention_bias=True),
            MegatronConfig(),
            params_dtype=torch.float32,
            use_cpu_initialization=True,
        )
