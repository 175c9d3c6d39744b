"""tools/random_qwen3.py: the random-weight models of the GPU rows and tests. On a GPU the weights
are made in a process of their own, so the caller (bench/gpu_matrix.py runs every row of its group
in one process) holds no CUDA context beside the runs it measures; here the same path runs on the
CPU and must write the same weights as a build in the caller's process."""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from tools.random_qwen3 import build_random_qwen3  # noqa: E402

SHAPE = (64, 2, 4, 2, 128, 1000)  # hidden, layers, heads, kv heads, intermediate, vocab


def test_weights_built_in_a_process_of_their_own_are_the_callers(tmp_path):
    here = build_random_qwen3(str(tmp_path / "here"), *SHAPE, own_process=False)
    child = build_random_qwen3(str(tmp_path / "child"), *SHAPE, own_process=True)
    a, b = (load_file(os.path.join(path, "model.safetensors")) for path in (here, child))
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        assert a[name].dtype == torch.bfloat16 and torch.equal(a[name], b[name]), name
    assert sorted(os.listdir(here)) == sorted(os.listdir(child))  # config and tokenizer too
    other = build_random_qwen3(str(tmp_path / "seed1"), *SHAPE, seed=1, own_process=True)
    embed = "model.embed_tokens.weight"  # random (the norms are ones in every build)
    assert not torch.equal(load_file(os.path.join(other, "model.safetensors"))[embed], a[embed])
