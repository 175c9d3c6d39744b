"""Write a Qwen3 model with random weights (bf16) and the shipped byte-level tokenizer to a
directory: GPU tests and benchmarks of model shapes without downloading weights.

    python tools/random_qwen3.py OUT --hidden 1024 --layers 28 --heads 16 --kv-heads 8 \
        --intermediate 3072 --vocab 151936          # Qwen3-0.6B's shape
    python tools/random_qwen3.py OUT --hidden 2048 --layers 28 --heads 16 --kv-heads 8 \
        --intermediate 6144 --vocab 151936          # Qwen3-1.7B's shape

The tokenizer (261 ids) is the tiny model's, so prompts of the built-in task tokenise; a larger
vocabulary only adds ids no prompt uses. Same seed, same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def build_random_qwen3(
    out: str,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    seed: int = 0,
    init_std: float = 0.02,
    max_positions: int = 4096,
    head_dim: int | None = None,
    config_only: bool = False,
    tied: bool | None = None,
    own_process: bool | None = None,
) -> str:
    """The model directory `out`; config_only writes config.json and the tokenizer without weights
    (enough for a dry run's memory plan, which reads the shape only); tied: embeddings tied (None:
    as Qwen3 does at that width). The weights are initialised on the GPU where there is one (a 4B
    shape takes minutes of CPU init otherwise), in a process of their own (own_process; None: where
    there is a GPU): a CUDA context left in the caller holds ~0.6 GiB of the card beside every run it
    then starts and measures (the matrix rows that built their model read 0.60-0.61 GiB more than
    the same rows on a built one, 2026-11-28)."""
    import torch
    from transformers import Qwen3Config

    from dagrl.data.builtin import tiny_model_path

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim or max(hidden // heads, 16),  # Qwen3's own: 128 at every size
        max_position_embeddings=max_positions,
        tie_word_embeddings=hidden < 4096 if tied is None else tied,  # Qwen3: tied to 4B, untied from 8B
        initializer_range=init_std,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    os.makedirs(out, exist_ok=True)
    config.save_pretrained(out)
    if not config_only:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if own_process if own_process is not None else device == "cuda":
            code = f"import sys; sys.path.insert(0, {ROOT!r}); from tools.random_qwen3 import write_weights; "
            code += f"write_weights({out!r}, {seed}, {device!r})"
            subprocess.run([sys.executable, "-c", code], check=True)
        else:
            write_weights(out, seed, device)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(tiny_model_path(), name), os.path.join(out, name))
    # the tiny model's 64-position limit would not be this shape's: transformers warns of
    # "indexing errors" for every prompt longer than the tokenizer's model_max_length
    path = os.path.join(out, "tokenizer_config.json")
    with open(path) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["model_max_length"] = max_positions
    with open(path, "w") as f:
        json.dump(tokenizer_config, f, indent=2)
    return out


def write_weights(out: str, seed: int, device: str) -> None:
    """Random bf16 weights for the config in `out`, initialised on `device`, saved beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out)


def add_shape_args(ap: argparse.ArgumentParser) -> None:
    """The shape options of the benches that build their own model: Qwen3-0.6B's by default."""
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv_heads", type=int, default=8)
    ap.add_argument("--head_dim", type=int, default=128, help="Qwen3's at every size")
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--vocab", type=int, default=151936)


def build_from_args(out: str, args) -> str:
    """A random-weight model of the shape add_shape_args parsed (bf16, shipped tokenizer) in OUT/model."""
    path = os.path.join(out, "model")
    build_random_qwen3(
        path,
        args.hidden,
        args.layers,
        args.heads,
        args.kv_heads,
        args.intermediate,
        args.vocab,
        head_dim=args.head_dim,
    )
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=3072)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=None, help="default hidden / heads; Qwen3 uses 128")
    a = p.parse_args()
    build_random_qwen3(
        a.out, a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab, a.seed, head_dim=a.head_dim
    )
    print(a.out)


if __name__ == "__main__":
    main()
