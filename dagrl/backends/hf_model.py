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


def check_model_dir(path: str, key: str, weights: bool = True) -> None:
    """A local HF model directory that loading will not fail on halfway: config.json parses to a
    dict with a model_type, and the weights are there, whole. Safetensors files are checked against
    their own header (the tensors' byte ranges must fit in the file: a truncated copy fails);
    sharded checkpoints must have every shard their index names. Reads headers only. With
    weights=False only config.json is checked."""
    import json

    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full):
        raise ConfigError(
            key, path, "no such directory; give a local model directory saved by save_pretrained"
        )
    try:
        with open(os.path.join(full, "config.json")) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ConfigError(key, path, "not a HF model directory: no config.json there") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            key, path, f"config.json is not valid JSON ({exc}); restore it from the original"
        ) from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(key, path, "config.json has no model_type; restore it from the original model")
    if not weights:
        return
    files = os.listdir(full)
    weights = [f for f in files if f.endswith((".safetensors", ".bin", ".pt", ".pth"))]
    if not weights:
        raise ConfigError(
            key, path, "no weights there (*.safetensors or pytorch_model*.bin); copy the model's weight files"
        )
    for index in (f for f in files if f.endswith(".index.json")):
        with open(os.path.join(full, index)) as f:
            shards = set(json.load(f).get("weight_map", {}).values())
        missing = sorted(shards - set(files))
        if missing:
            raise ConfigError(key, path, f"{index} names shards that are missing: {missing[:3]}")
    for name in (f for f in weights if f.endswith(".safetensors")):
        problem = _safetensors_problem(os.path.join(full, name))
        if problem:
            raise ConfigError(key, path, f"{name} is damaged ({problem}); copy it again")


def _safetensors_problem(file: str) -> str | None:
    """What is wrong with a safetensors file's layout (None when its header and size agree)."""
    import json
    import struct

    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a header"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"header of {n} bytes but the file has {size}"
        try:
            header = json.loads(f.read(n))
        except ValueError as exc:
            return f"unreadable header: {exc}"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"truncated: the tensors need {8 + n + end} bytes, the file has {size}"
    return None


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
