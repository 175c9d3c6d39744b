"""Loading HF causal LMs and tokenizers from a local directory (offline)."""

from __future__ import annotations

import os

import torch

from dagrl.errors import ConfigError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_model_path(path: str | None) -> str:
    """None means the tiny model that ships with dagrl."""
    if path is None:
        from dagrl.data.builtin import tiny_model_path

        return tiny_model_path()
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(os.path.join(full, "config.json")):
        raise ConfigError(
            "actor_rollout_ref.model.path",
            path,
            "not a HF model directory (no config.json there); give a local directory saved by save_pretrained",
        )
    return full


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError("actor_rollout_ref.model.dtype", name, f"use one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_causal_lm(path: str, dtype: str, device: torch.device, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
    )
    return model.to(device)


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def eos_token_ids(tokenizer, generation_config) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's (a list or one)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def load_generation_config(path: str, trust_remote_code: bool = False):
    """The model directory's generation_config.json, or the defaults its config.json implies."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: transformers derives one from config.json
        return GenerationConfig.from_model_config(
            AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        )
