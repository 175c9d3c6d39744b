"""On one GPU: the README's configuration (0.6B shape, 32 prompts × 8 × 256 tokens, vLLM colocated,
the defaults) runs 20 steps, and the device memory at each hand-over point is flat from step 2 on
(within 1 GiB): nothing the trainer or the engine leaves behind grows from step to step."""

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_twenty_default_steps_keep_the_hand_over_flat(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    from gpu_matrix import run_row, table_row

    result = run_row(str(tmp_path), "0.6b-32x8x256", timeout=540)
    print("ROW", result)
    if os.environ.get("GPU_MATRIX_ROWS"):  # bench/acceptance_gpu.sh: this run is also a matrix row
        with open(os.environ["GPU_MATRIX_ROWS"], "a") as f:
            f.write(table_row(result) + "\n")
    assert result["rc"] == 0 and result["steps"] == 20, result["tail"]
    assert result["grad_norm"][-1] > 0
    assert result["handover"], "no hand-over samples were reported"
    for key, seen in result["handover"].items():
        assert seen["max"] - seen["min"] <= 1.0, (key, seen)
